"""``tokmem serve``: an OpenAI-compatible server for many banks on one frozen backbone.

``api`` (routes, request and response models), ``engine`` (one decoding loop, continuous batching
across banks), ``banks`` (the bank directory: lazy loading, LRU, validated uploads, hot swap).
"""
