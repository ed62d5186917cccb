"""A vLLM worker extension (``worker_extension_cls``): lets a client ask where its banks sit in the slots,
with ``LLM.collective_rpc("tokmem_placements")``, to name the procedures behind an answer's memory ids."""

from __future__ import annotations

from tokmem.vllm import slots


class TokMemWorker:
    def tokmem_placements(self) -> dict[str, dict]:
        """For each bank placed in this worker (by resolved path; the newest revision): its offset and row names."""
        return {key[0]: {"offset": p.offset, "names": list(p.bank.names)} for key, p in slots.current().placed.items()}
