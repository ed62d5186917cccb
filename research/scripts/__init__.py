"""The A/B and diagnostic scripts of the research record, each run from the repository root as a module
(``python -m research.scripts.loop_ab …``); its docstring says what it measures and which results file it wrote."""
