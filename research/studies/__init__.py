"""The paper's studies: each a function returning a result dict, plus its `python -m research bench` subcommand."""
