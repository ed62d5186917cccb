"""The re-answering script (benchmarks/reanswer_loop.py): a kept bank answered again per step, scored as the A/Bs
score it."""

import json

from helpers import city_count_chain, load_script

from tokmem.eval.tool_loop import _Quiet

reanswer_loop = load_script("reanswer_loop")
CHAIN = city_count_chain()


def answer_with(wrong_at: int):
    """An answerer that makes each step's gold call, but calls the first tool again at step ``wrong_at``."""

    def answer(examples, histories, caches, choice):
        calls = []
        for example, history in zip(examples, histories):
            step = example.steps[0 if len(history) == wrong_at else len(history)]
            calls.append((step.response, json.loads(step.response)["name"]))
        return calls, 0

    return answer


def test_step_scores_count_each_answer_against_its_own_steps_gold_call_with_the_outcomes():
    right = reanswer_loop.step_scores(answer_with(-1), [CHAIN], _Quiet(), "gold")
    assert right["step"]["exact_steps"]["all"] == 2
    assert right["outcomes"]["steps"]["exact"] == 2
    repeated = reanswer_loop.step_scores(answer_with(1), [CHAIN], _Quiet(), "repeat")
    assert repeated["step"]["exact_steps"]["all"] == 1
    assert repeated["samples"][0]["step"] == [CHAIN.steps[0].response] * 2
    assert repeated["outcomes"]["steps"]["exact"] == 1 and sum(repeated["outcomes"]["steps"].values()) == 2
