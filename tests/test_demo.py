"""The demo end to end on tiny-random, and its instructed baseline: the plain backbone given written
instructions instead of memory tokens."""

import json

import tokmem
from tokmem import Example, Step
from tokmem.backbones import load_backbone
from tokmem.bank.memory_bank import MemoryBank
from tokmem.decoding.decode import DecodeConfig
from research.methods.method import plain_answers
from tokmem.cli import main
from tokmem.data.builtin import demo_dataset, instructed_prompt
from tokmem.demo import DECODE, gold_procedures, instructed_scores, prompt_tokens

QUERY = 'What is the first word of "apple river"?'


def tokenizer_count(tokenizer, messages) -> int:
    return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])


def test_prompt_tokens_are_the_tokenizers_count_of_the_chat_formatted_prompts(backbone):
    tokenizer = backbone.tokenizer
    instructed = instructed_prompt(["first_word", "quote_word"], QUERY)
    expected = (
        tokenizer_count(tokenizer, [{"role": "user", "content": QUERY}]) + tokenizer_count(tokenizer, instructed)
    ) / 2
    assert prompt_tokens(tokenizer, [QUERY, instructed]) == expected


def test_the_instructed_prompt_costs_more_tokens_than_the_query_alone(backbone):
    tokenizer = backbone.tokenizer
    one = prompt_tokens(tokenizer, [instructed_prompt(["first_word"], QUERY)])
    two = prompt_tokens(tokenizer, [instructed_prompt(["first_word", "quote_word"], QUERY)])
    assert prompt_tokens(tokenizer, [QUERY]) < one < two


def test_instructed_scores_grade_the_answers_to_the_instructed_prompts(lively_backbone):
    plain = tokmem.create(lively_backbone)
    one_at_a_time = DecodeConfig(max_new_tokens=DECODE.max_new_tokens, batch_size=1)
    instructed = plain_answers(plain, [instructed_prompt(["first_word"], QUERY)], one_at_a_time)[0]
    bare = plain_answers(plain, [QUERY], one_at_a_time)[0]
    assert instructed != bare  # else this test could not tell the two prompts apart
    examples = [
        Example(QUERY, (Step("first_word", instructed),)),  # graded right only if the instruction was in the prompt
        Example(QUERY, (Step("kebab_case", instructed + " and more"),)),
        Example(QUERY, (Step("first_word", "apple"), Step("quote_word", '"apple"'))),
    ]
    scores = instructed_scores(plain, examples[:1] + examples[2:], gold_procedures)
    assert scores["exact_match_per_procedure"] == {"first_word": 1.0}
    assert scores["exact_match"] == 0.5 and scores["chain_exact_match"] == 0.0
    assert scores["prompt_tokens"] == prompt_tokens(
        plain.backbone.tokenizer,
        [instructed_prompt(["first_word"], QUERY), instructed_prompt(["first_word", "quote_word"], QUERY)],
    )
    every = instructed_scores(plain, examples[:2], lambda _: ["first_word"])
    assert every["exact_match_per_procedure"] == {"first_word": 1.0, "kebab_case": 0.0}


DEMO_PROCEDURES = ["first_word", "quote_word", "percent"]


def test_demo_reports_accuracies_and_prompt_tokens_and_saves_its_bank(tmp_path):
    out, bank = tmp_path / "demo.json", tmp_path / "demo.safetensors"
    assert (
        main(
            [
                "demo",
                "--backbone",
                "tiny-random",
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--train-per-procedure",
                "3",
                "--procedures",
                ",".join(DEMO_PROCEDURES),
                "--no-decoupled",
                "--device",
                "cpu",
                "--quiet",
                "--json",
                str(out),
                "--out",
                str(bank),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["train_examples"] == 3 * 3 + 40 and result["config"]["decoupled"] is False
    assert {
        "backbone",
        "procedures",
        "routing_accuracy",
        "exact_match",
        "chain_accuracy",
        "train_seconds",
    } <= result.keys()
    assert result["backbone"] == "tiny-random" and result["procedures"] == 3
    rates = (
        "routing_accuracy",
        "exact_match",
        "chain_accuracy",
        "chain_exact_match",
        "instruction_exact_match",
        "instruction_chain_exact_match",
        "all_instructions_exact_match",
        "all_instructions_chain_exact_match",
    )
    assert all(0 <= result[k] <= 1 for k in rates)
    assert set(result["instruction_exact_match_per_procedure"]) == set(DEMO_PROCEDURES)
    assert MemoryBank.load(bank).names == result["train"]["new_procedures"]
    assert not MemoryBank.load(bank).decoupled

    _, test = demo_dataset(seed=0, train_per_procedure=3, procedures=DEMO_PROCEDURES)
    tokenizer = load_backbone("tiny-random").tokenizer
    assert result["tokmem_prompt_tokens"] == prompt_tokens(tokenizer, [e.query for e in test])
    assert result["instruction_prompt_tokens"] == prompt_tokens(
        tokenizer, [instructed_prompt(e.procedures, e.query) for e in test]
    )
    assert result["all_instructions_prompt_tokens"] == prompt_tokens(
        tokenizer, [instructed_prompt(DEMO_PROCEDURES, e.query) for e in test]
    )
    assert (
        result["tokmem_prompt_tokens"] < result["instruction_prompt_tokens"] < result["all_instructions_prompt_tokens"]
    )


def test_demo_rejects_an_unknown_procedure(capsys):
    assert main(["demo", "--backbone", "tiny-random", "--procedures", "first_word,no_such_procedure", "--quiet"]) == 2
    assert "no_such_procedure" in capsys.readouterr().err
