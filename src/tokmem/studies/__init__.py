"""The paper's studies: each a function returning a result dict, plus its `tokmem bench` subcommand."""
