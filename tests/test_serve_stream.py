"""Streamed text: incremental decoding agrees with decoding the whole answer at once; stop sequences cut it."""

from helpers import random_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import tokmem
from tokmem.decoding.decode import to_generation
from tokmem.serve.stream import IncrementalText, StopSequences


def test_incremental_text_equals_the_whole_answers_text_however_the_tokens_arrive(backbone):
    model = tokmem.create(backbone)
    model.bank.add(["say", "call"], backbone.mean_embedding(), kinds=["text", "tool"])
    random_rows(model.bank)
    vocab, eos = model.vocab_size, backbone.eos_token_id
    tokens = st.lists(st.integers(0, vocab - 1) | st.sampled_from([vocab, vocab + 1, eos]), max_size=40)

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(tokens, st.lists(st.integers(1, 5), max_size=20), st.booleans())
    def check(row, cuts, routed):
        # as decoding makes them: a routed answer starts with a memory token, an open-set one has none
        row = [vocab] + row if routed else [t for t in row if t < vocab]
        text, seen = IncrementalText(model), 0
        for cut in cuts:
            seen = min(len(row), seen + cut)
            text.update(row[:seen])
        assert text.update(row) == to_generation(model, "q", row, 0.0, routed).text

    check()


def test_stop_sequences_cut_at_the_first_and_a_stream_holds_back_what_may_begin_one():
    stops = StopSequences(("END", "\n\n"))
    assert stops.cut("one\n\ntwo END") == "one" and stops.cut("no stop here") == "no stop here"
    assert stops.cut("abc EN", final=False) == "abc " and stops.cut("abc EN") == "abc EN"
    assert stops.cut("abc\n", final=False) == "abc" and not StopSequences()
