"""The research beside the product: the paper's studies, the methods they compare, their command line and the A/B
and diagnostic scripts.  The ``tokmem`` package never imports it; run it from the repository root (``python -m
research bench STUDY``), where ``research`` is importable."""
