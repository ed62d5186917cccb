"""Training the bank's rows: the training sequence (``sequences``), the loop (``train``), the loss and the passes it
takes (``loss``), the query prefixes kept across epochs (``prefix_store``), what ``--resume`` needs (``train_state``),
the fits after training (``refit``), the adaptation phase (``adapt``) and its LoRA (``lora``), and the few collective
operations of a run under a launcher (``distributed``)."""
