"""The vLLM plugin against ``tokmem.generate``: greedy answers token-identical, several banks in one batch."""

import pytest
from conftest import start_llm, stop_llm
from helpers import QUERIES, write_served_banks
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError

import tokmem
from tokmem.decoding.decode import DecodeConfig, to_generation
from tokmem.training.sequences import chat_prefix
from tokmem.vllm import procedures, prompt, sampling_params

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def bank_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("banks")


@pytest.fixture(scope="module")
def offline(vllm_backbone, bank_dir):
    """The served banks (3 rows, 4 rows decoupled, 1 row, empty), saved in ``bank_dir``; name -> offline model."""
    return write_served_banks(vllm_backbone, bank_dir)


@pytest.fixture(scope="module")
def paths(offline, bank_dir):
    return {name: (bank_dir / f"{name}.safetensors").resolve() for name in offline}


@pytest.fixture(scope="module")
def llm(vllm_model_dir):
    engine = start_llm(vllm_model_dir, slots=16)
    yield engine
    stop_llm(engine)


def cases(offline):
    """(bank name, query, options): every bank and query routed at two thresholds, plus forced procedures."""
    out = [(name, q, {"threshold": t}) for name in offline for q in QUERIES for t in (0.5, 0.0)]
    out += [
        (name, q, {"procedure": "p1", "max_steps": steps})
        for name in ("alpha", "beta")
        for q in QUERIES[:2]
        for steps in (1, 2)
    ]
    return out


def reference(offline, name, query, options):
    config = DecodeConfig(
        max_new_tokens=MAX_TOKENS, threshold=options.get("threshold", 0.5), max_steps=options.get("max_steps", 4)
    )
    return tokmem.generate(offline[name], [query], config, procedure=options.get("procedure"))[0]


def test_greedy_answers_across_banks_in_one_batch_equal_tokmem_generate(llm, offline, paths, vllm_backbone):
    tokenizer, vocab = vllm_backbone.tokenizer, vllm_backbone.vocab_size
    batch = cases(offline)
    prompts = [prompt(tokenizer, q, paths[name]) for name, q, _ in batch]
    params = [sampling_params(paths[name], max_tokens=MAX_TOKENS, **options) for name, _, options in batch]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    placements = llm.collective_rpc("tokmem_placements")[0]

    answers = []
    for (name, query, options), output in zip(batch, outputs):
        ids = list(output.outputs[0].token_ids)
        offset = placements[str(paths[name])]["offset"]
        relative = [t - offset if t >= vocab else t for t in ids]
        served = to_generation(offline[name], query, relative, 0.0, routed=bool(ids) and ids[0] >= vocab)
        expected = reference(offline, name, query, options)
        assert (served.routed, served.trace) == (expected.routed, expected.trace), (name, query, options)
        # slots are no text (vLLM's incremental detokenizer holds back a trailing incomplete UTF-8 character)
        assert tokenizer.decode([t for t in ids if t < vocab], skip_special_tokens=True).startswith(
            output.outputs[0].text
        )
        answers.append(expected)
    # the comparison means something: answers route, stay plain, and chain
    assert any(not a.routed for a in answers) and any(a.routed for a in answers)
    assert any(len(a.procedures) >= 2 for a in answers)


def test_a_request_without_a_bank_is_plain_vllm_and_never_gets_a_memory_token(llm, offline, paths, vllm_backbone):
    tokenizer, vocab = vllm_backbone.tokenizer, vllm_backbone.vocab_size
    plain = {"prompt_token_ids": chat_prefix(tokenizer, QUERIES[0])}
    routed = prompt(tokenizer, QUERIES[0], paths["alpha"])
    outputs = llm.generate(
        [plain, routed],
        [
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
            sampling_params(paths["alpha"], threshold=0.0, max_tokens=MAX_TOKENS),
        ],
        use_tqdm=False,
    )
    ids = list(outputs[0].outputs[0].token_ids)
    assert all(t < vocab for t in ids)
    assert outputs[1].outputs[0].token_ids[0] >= vocab  # the other row of the batch did route
    expected = reference(offline, "empty", QUERIES[0], {})  # an empty bank answers as the plain backbone
    assert outputs[0].outputs[0].text.strip() == expected.text


@pytest.mark.parametrize(
    "options, field",
    [
        ({"bank": "missing.safetensors"}, "missing.safetensors"),
        ({"procedure": "nope"}, "nope"),
        ({"threshold": 2.0}, "tokmem_threshold"),
        ({"max_steps": 0}, "tokmem_max_steps"),
    ],
)
def test_a_bad_request_is_refused_with_its_field_and_the_engine_serves_on(llm, paths, vllm_backbone, options, field):
    bank = options.pop("bank", paths["alpha"])
    query = prompt(vllm_backbone.tokenizer, QUERIES[1], paths["alpha"])
    with pytest.raises(VLLMValidationError, match=field):  # the front end's refusal (HTTP 400 from vllm serve)
        llm.generate([query], [sampling_params(bank, max_tokens=4, **options)], use_tqdm=False)
    answer = llm.generate([query], [sampling_params(paths["alpha"], max_tokens=4)], use_tqdm=False)
    assert len(answer[0].outputs[0].token_ids) == 4


def test_procedures_names_the_memory_tokens_of_an_answer(llm, paths, vllm_backbone):
    vocab, bank = vllm_backbone.vocab_size, paths["beta"]
    output = llm.generate(
        [prompt(vllm_backbone.tokenizer, QUERIES[0], bank)],
        [sampling_params(bank, procedure="p2", max_steps=1, max_tokens=8)],
        use_tqdm=False,
    )
    placement = llm.collective_rpc("tokmem_placements")[0][str(bank)]
    assert procedures(list(output[0].outputs[0].token_ids), vocab, placement) == ["p2"]
