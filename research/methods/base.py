"""Base: the frozen backbone answers the query alone (chat template, no demonstrations)."""

from __future__ import annotations

import tokmem
from tokmem.decoding.decode import DecodeConfig
from tokmem.backbones import Backbone
from research.methods.method import Answer, Method, plain_answers


class Base(Method):
    name = "base"
    label = "Base"
    learns = False

    def __init__(self, backbone: Backbone, decode: DecodeConfig | None = None):
        self.model = tokmem.create(backbone)  # an empty bank: the plain backbone
        self.decode_config = decode or DecodeConfig()

    def answer(self, queries: list[str]) -> list[Answer]:
        return [Answer(text) for text in plain_answers(self.model, queries, self.decode_config)]
