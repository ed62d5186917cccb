"""Base: the frozen backbone answers the query alone (chat template, no demonstrations)."""

from __future__ import annotations

import tokmem
from tokmem.decode import DecodeConfig
from tokmem.backbones import Backbone
from tokmem.methods.method import Answer, Method, plain_answers


class Base(Method):
    name = "base"
    label = "Base"
    learns = False

    def __init__(
        self,
        backbone: Backbone,
        max_new_tokens: int = DecodeConfig.max_new_tokens,
        eval_batch_size: int = DecodeConfig.batch_size,
    ):
        self.model = tokmem.create(backbone)  # an empty bank: the plain backbone
        self.max_new_tokens = max_new_tokens
        self.eval_batch_size = eval_batch_size

    def answer(self, queries: list[str]) -> list[Answer]:
        return [Answer(text) for text in plain_answers(self.model, queries, self.max_new_tokens, self.eval_batch_size)]
