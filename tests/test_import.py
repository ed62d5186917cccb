"""Real tool-calling formats (NESTFUL, BFCL, xLAM) to procedure examples, and `tokmem data import`."""

import gzip
import json
import sys
from pathlib import Path

import pytest

from tokmem.bank.memory_bank import MemoryBank
from tokmem.cli import main
from tokmem.data import load_catalog, load_examples
from tokmem.data.bfcl import import_bfcl, parse_call
from tokmem.data.bfcl_backends import BACKENDS
from tokmem.data.nestful import import_nestful
from tokmem.data.openai_chat import LATER_TURNS, import_openai
from tokmem.data.procedures import call_json
from tokmem.data.xlam import import_xlam
from tokmem.errors import DataError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "function-calling"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent")


def write_json(path: Path, data, lines=False, gz=False) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in data) if lines else json.dumps(data)
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def steps(example):
    return [(s.procedure, json.loads(s.response)) for s in example.steps]


# ---- NESTFUL -------------------------------------------------------------------------------------------------

SPEC = [
    {
        "name": "Search_Hotel_Destination",
        "description": "Find a destination.",
        "host": "booking.example",
        "query_parameters": {
            "query": {"type": "string", "description": "Place.", "required": True, "enum": [], "default": None}
        },
    },
    {
        "name": "Search_Hotels",
        "description": "Search hotels.",
        "query_parameters": {
            "dest_id": {"type": "string", "description": "Destination.", "required": True},
            "sort_by": {"type": "string", "description": "Order.", "required": False, "enum": ["price", "distance"]},
        },
    },
    {"name": "Never_Called", "description": "Not used.", "query_parameters": {}},
]


def nestful_record(query, *calls):
    output = [
        {"name": name, "arguments": arguments, "label": f"var{k}", "response": {"call": k}}
        for k, (name, arguments) in enumerate(calls, 1)
    ]
    return {"input": f" {query}", "output": output, "num_successful_calls": len(calls)}


HOTELS = nestful_record(
    "Find hotels in Rome by price.",
    ("Search_Hotel_Destination", {"query": "Rome"}),
    ("Search_Hotels", {"dest_id": "$var1.dest_id$", "sort_by": "price"}),
)


@pytest.fixture
def nestful_file(tmp_path):
    """IBM's layout: X-data.json.gz with X-spec.json.gz beside it."""
    write_json(tmp_path / "cfb-spec.json.gz", SPEC, gz=True)
    records = [
        HOTELS,
        nestful_record("Where is Oslo?", ("Search_Hotel_Destination", {"query": "Oslo"})),
        nestful_record("Book a taxi.", ("Search_Taxi", {"from": "a"})),
        {"input": "Nothing to call.", "output": []},
    ]
    return write_json(tmp_path / "cfb-data.json.gz", records, gz=True)


def test_nestful_records_become_one_step_per_call_with_references_kept_as_strings(nestful_file):
    imported = import_nestful(nestful_file)
    assert imported.records == 4 and len(imported.examples) == 2
    hotels = imported.examples[0]
    assert hotels.query == "Find hotels in Rome by price." and hotels.id == "0"
    assert steps(hotels) == [
        ("Search_Hotel_Destination", {"name": "Search_Hotel_Destination", "arguments": {"query": "Rome"}}),
        ("Search_Hotels", {"name": "Search_Hotels", "arguments": {"dest_id": "$var1.dest_id$", "sort_by": "price"}}),
    ]
    assert hotels.steps[1].response == call_json("Search_Hotels", {"dest_id": "$var1.dest_id$", "sort_by": "price"})
    assert [s.result for s in hotels.steps] == ['{"call":1}', '{"call":2}']
    assert [s.result for s in import_nestful(nestful_file, results=False).examples[0].steps] == [None, None]
    assert imported.calls_per_example() == {1: 1, 2: 1}


def test_nestful_spec_becomes_a_json_schema_catalog_of_the_called_tools(nestful_file):
    catalog = import_nestful(nestful_file).catalog
    assert list(catalog) == ["Search_Hotel_Destination", "Search_Hotels"]
    assert catalog["Search_Hotels"] == {
        "name": "Search_Hotels",
        "description": "Search hotels.",
        "parameters": {
            "type": "object",
            "required": ["dest_id"],
            "properties": {
                "dest_id": {"type": "string", "description": "Destination."},
                "sort_by": {"type": "string", "description": "Order.", "enum": ["price", "distance"]},
            },
        },
    }
    assert catalog["Search_Hotel_Destination"]["parameters"]["properties"]["query"] == {
        "type": "string",
        "description": "Place.",
    }


def test_nestful_counts_the_records_it_skips_by_reason(nestful_file):
    assert import_nestful(nestful_file).skipped == {
        "records calling a tool with no schema": 1,
        "records with no calls": 1,
    }


def test_nestful_takes_tools_from_the_record_and_leaves_out_the_var_result_answer_step(tmp_path):
    tools = [{"name": "add", "description": "Add.", "parameters": {"a": {"type": "int", "required": True}}}]
    record = {
        "sample_id": "s-1",
        "input": "Add 2, then add 3 to it.",
        "tools": tools,
        "output": [
            {"name": "add", "arguments": {"a": 2}, "label": "var_1"},
            {"name": "add", "arguments": {"a": "$var_1.result$"}, "label": "var_2"},
            {"name": "var_result", "arguments": {"sum": "$var_2.result$"}},
        ],
    }
    imported = import_nestful(write_json(tmp_path / "own.jsonl", [record], lines=True))
    [example] = imported.examples
    assert example.id == "s-1" and example.procedures == ["add", "add"]
    assert steps(example)[1][1]["arguments"] == {"a": "$var_1.result$"}
    assert imported.skipped == {"var_result steps (NESTFUL's final answer, not a tool call)": 1}
    assert imported.catalog["add"]["parameters"]["required"] == ["a"]


def test_nestful_uses_an_explicit_spec_and_without_any_schemas_says_so(tmp_path):
    data = write_json(tmp_path / "mine.json", [HOTELS])
    with pytest.raises(DataError, match=r"mine.json: record 0: no tool schemas: .*no spec file was given"):
        import_nestful(data)
    spec = write_json(tmp_path / "tools.json", SPEC)
    assert [e.procedures for e in import_nestful(data, spec).examples] == [
        ["Search_Hotel_Destination", "Search_Hotels"]
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input": "  "}, "input"),
        ({"output": {"name": "Search_Hotels"}}, "output"),
        ({"output": [{"arguments": {}, "label": "var1"}]}, "output[0]"),
        (
            {"output": [HOTELS["output"][0], {"name": "Search_Hotels", "arguments": "x", "label": "var2"}]},
            "output[1].arguments",
        ),
        ({"output": [{"name": "Search_Hotels", "arguments": {}}]}, "output[0].label"),
        ({"tools": [{"description": "nameless"}]}, "tools[0]"),
        ({"tools": [{"name": "f", "parameters": {"x": "int"}}]}, "tools[0].parameters.x"),
    ],
)
def test_a_bad_nestful_record_is_refused_naming_file_record_and_field(tmp_path, change, field):
    write_json(tmp_path / "x-spec.json", SPEC)
    path = write_json(tmp_path / "x-data.json", [HOTELS, {**HOTELS, **change}])
    with pytest.raises(DataError) as caught:
        import_nestful(path)
    assert str(caught.value).startswith(f"{path}: record 1, field '{field}'")


@pytest.mark.parametrize(
    ("tool", "field"),
    [
        ({"description": "nameless"}, "name"),
        ({"name": "f", "query_parameters": ["x"]}, "query_parameters"),
        ({"name": "f", "query_parameters": {"x": 3}}, "query_parameters.x"),
    ],
)
def test_a_bad_spec_entry_is_refused_naming_the_spec_file_record_and_field(tmp_path, tool, field):
    spec = write_json(tmp_path / "x-spec.json", [SPEC[0], tool])
    with pytest.raises(DataError) as caught:
        import_nestful(write_json(tmp_path / "x-data.json", [HOTELS]))
    assert str(caught.value).startswith(f"{spec}: record 1, field '{field}'")


# ---- BFCL single-turn ----------------------------------------------------------------------------------------

WEATHER = {
    "name": "get_weather",
    "description": "Weather.",
    "parameters": {
        "type": "dict",
        "required": ["city"],
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer"},
            "options": {"type": "dict"},
            "stops": {"type": "array"},
        },
    },
}
ORDER = {
    "name": "shop.order",
    "description": "Order.",
    "parameters": {"type": "dict", "properties": {"item": {"type": "string"}}},
}


def bfcl_question(qid, text, functions, system=None):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return {"id": qid, "question": [messages], "function": functions}


def bfcl_files(folder: Path, name: str, questions, answers) -> Path:
    (folder / "possible_answer").mkdir(parents=True, exist_ok=True)
    write_json(folder / "possible_answer" / name, answers, lines=True)
    return write_json(folder / name, questions, lines=True)


@pytest.fixture
def parallel_file(tmp_path):
    questions = [
        bfcl_question("parallel_0", "Weather in Paris, then Rome in Fahrenheit.", [WEATHER, ORDER], system="Be brief."),
        bfcl_question("parallel_1", "Order tea.", [WEATHER]),
        bfcl_question("parallel_2", "Order cake.", [ORDER]),
    ]
    answers = [
        {
            "id": "parallel_0",
            "ground_truth": [
                {
                    "get_weather": {
                        "city": ["Paris", "Paris, France"],
                        "unit": ["", "c"],
                        "days": [""],
                        "options": [{"detail": ["", "high"], "alerts": [""]}],
                        "stops": [[{"name": ["A"], "wait": [5, ""]}]],
                    }
                },
                {"get_weather": {"city": ["Rome"], "unit": ["f"], "options": [{"x": 1.5}]}},
            ],
        },
        {"id": "parallel_1", "ground_truth": [{"shop.order": {"item": ["tea"]}}]},
        {"id": "parallel_2", "ground_truth": [{"shop.order": {"item": ["cake"]}}]},
    ]
    return bfcl_files(tmp_path, "BFCL_v4_parallel.json", questions, answers)


def test_bfcl_gold_arguments_take_the_first_acceptable_non_empty_value_and_leave_out_optional_ones(parallel_file):
    imported = import_bfcl(parallel_file)
    weather = imported.examples[0]
    assert weather.id == "parallel_0" and weather.query == "Weather in Paris, then Rome in Fahrenheit."
    assert steps(weather) == [
        (
            "get_weather",
            {
                "name": "get_weather",
                "arguments": {
                    "city": "Paris",
                    "unit": "c",
                    "options": {"detail": "high"},
                    "stops": [{"name": "A", "wait": 5}],
                },
            },
        ),
        ("get_weather", {"name": "get_weather", "arguments": {"city": "Rome", "unit": "f", "options": {"x": 1.5}}}),
    ]
    assert imported.catalog["get_weather"] == WEATHER


def test_bfcl_counts_skipped_calls_and_left_out_system_messages(parallel_file):
    imported = import_bfcl(parallel_file)
    assert imported.records == 3 and [e.id for e in imported.examples] == ["parallel_0", "parallel_2"]
    assert imported.skipped == {
        "records calling a tool with no schema": 1,
        "system and other non-user messages (the query is the user's message)": 1,
    }


def test_bfcl_counts_records_that_define_a_called_tool_differently(tmp_path):
    other = {**ORDER, "description": "Order something else."}
    questions = [
        bfcl_question("q0", "Order tea.", [ORDER]),
        bfcl_question("q1", "Order jam; weather?", [other, WEATHER]),
    ]
    answers = [
        {"id": "q0", "ground_truth": [{"shop.order": {"item": ["tea"]}}]},
        {"id": "q1", "ground_truth": [{"shop.order": {"item": ["jam"]}}, {"get_weather": {"city": ["Oslo"]}}]},
    ]
    imported = import_bfcl(bfcl_files(tmp_path, "BFCL_v4_parallel.json", questions, answers))
    assert len(imported.examples) == 2 and imported.catalog == {"shop.order": ORDER, "get_weather": WEATHER}
    assert imported.skipped == {
        "records defining a called tool differently from the catalog (which keeps the first definition)": 1
    }


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ({"ground_truth": {"get_weather": {}}}, "ground_truth"),
        ({"ground_truth": [{"get_weather": {"city": "Paris"}}]}, "ground_truth[0].get_weather.city"),
        ({"ground_truth": [{"get_weather": {"city": []}}]}, "ground_truth[0].get_weather.city"),
        ({"ground_truth": [{"get_weather": {}, "shop.order": {}}]}, "ground_truth[0]"),
        ({"ground_truth": [{"get_weather": ["Paris"]}]}, "ground_truth[0].get_weather"),
    ],
)
def test_a_bad_bfcl_answer_is_refused_naming_the_answer_file_record_and_field(tmp_path, answer, field):
    path = bfcl_files(
        tmp_path, "BFCL_v4_parallel.json", [bfcl_question("p0", "Weather?", [WEATHER])], [{"id": "p0", **answer}]
    )
    with pytest.raises(DataError) as caught:
        import_bfcl(path)
    assert str(caught.value).startswith(
        f"{tmp_path / 'possible_answer' / 'BFCL_v4_parallel.json'}: record 0, field '{field}'"
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": "p9"}, "id"),
        ({"question": [[{"role": "user"}]]}, "question[0][0]"),
        ({"question": [[], []]}, "question"),
        ({"function": [{"name": "f", "parameters": {"properties": []}}]}, "function[0].parameters.properties"),
    ],
)
def test_a_bad_bfcl_question_is_refused_naming_the_question_file_record_and_field(tmp_path, change, field):
    question = {**bfcl_question("p0", "Weather?", [WEATHER]), **change}
    answers = [{"id": "p0", "ground_truth": [{"get_weather": {"city": ["Paris"]}}]}]
    path = bfcl_files(tmp_path, "BFCL_v4_parallel.json", [question], answers)
    with pytest.raises(DataError) as caught:
        import_bfcl(path)
    assert str(caught.value).startswith(f"{path}: record 0, field '{field}'")


# ---- BFCL multi-turn -----------------------------------------------------------------------------------------

FS_DOCS = [
    {
        "name": "cd",
        "description": "Change directory.",
        "parameters": {"type": "dict", "properties": {"folder": {"type": "string"}}, "required": ["folder"]},
    },
    {
        "name": "mv",
        "description": "Move.",
        "parameters": {
            "type": "dict",
            "properties": {"source": {"type": "string"}, "destination": {"type": "string"}},
            "required": ["source", "destination"],
        },
    },
    {
        "name": "post",
        "description": "Post.",
        "parameters": {
            "type": "dict",
            "properties": {"content": {"type": "string"}, "tags": {"type": "array"}},
            "required": ["content"],
        },
    },
]
DOCS = {doc["name"]: doc for doc in FS_DOCS}


@pytest.fixture
def multi_turn_file(tmp_path):
    (tmp_path / "multi_turn_func_doc").mkdir()
    write_json(tmp_path / "multi_turn_func_doc" / "file_system.json", FS_DOCS[:2], lines=True)
    write_json(tmp_path / "multi_turn_func_doc" / "posting.json", FS_DOCS[2:], lines=True)
    turns = ["Go to docs and move a.txt to tmp.", "Post 'done' tagged #fs.", "Thanks!", "Delete it."]
    question = {
        "id": "multi_turn_base_0",
        "question": [[{"role": "user", "content": t}] for t in turns],
        "initial_config": {},
        "involved_classes": ["GorillaFileSystem"],
    }
    gold = [
        ["cd(folder='docs')", "mv('a.txt', destination='tmp')"],
        ["post('done', tags=['#fs'])"],
        [],
        ["rm(file_name='a.txt')"],
    ]
    return bfcl_files(
        tmp_path, "BFCL_v4_multi_turn_base.json", [question], [{"id": "multi_turn_base_0", "ground_truth": gold}]
    )


def test_bfcl_multi_turn_turns_become_examples_with_their_parsed_calls(multi_turn_file):
    imported = import_bfcl(multi_turn_file)
    assert imported.records == 1 and [e.id for e in imported.examples] == [
        "multi_turn_base_0/turn-0",
        "multi_turn_base_0/turn-1",
    ]
    first, second = imported.examples
    assert first.query == "Go to docs and move a.txt to tmp."
    assert steps(first) == [
        ("cd", {"name": "cd", "arguments": {"folder": "docs"}}),
        ("mv", {"name": "mv", "arguments": {"source": "a.txt", "destination": "tmp"}}),
    ]
    assert steps(second) == [("post", {"name": "post", "arguments": {"content": "done", "tags": ["#fs"]}})]
    assert list(imported.catalog) == ["cd", "mv", "post"] and imported.catalog["mv"] == DOCS["mv"]
    assert imported.skipped == {"turns with no calls": 1, "turns calling a tool with no schema": 1}


FS_STATE = {
    "GorillaFileSystem": {
        "root": {
            "home": {
                "type": "directory",
                "contents": {"docs": {"type": "directory", "contents": {"a.txt": {"type": "file", "content": "hi"}}}},
            }
        }
    }
}


def executed_conversation(tmp_path, gold, classes=("GorillaFileSystem",)) -> Path:
    """A one-conversation multi-turn file over the real file system's ``cd``, ``ls`` and ``cat``, in FS_STATE."""
    (tmp_path / "multi_turn_func_doc").mkdir(parents=True)
    docs = [
        {"name": name, "description": name, "parameters": {"type": "dict", "properties": properties}}
        for name, properties in [
            ("cd", {"folder": {"type": "string"}}),
            ("ls", {"a": {"type": "boolean"}}),
            ("cat", {"file_name": {"type": "string"}}),
        ]
    ]
    write_json(tmp_path / "multi_turn_func_doc" / "file_system.json", docs, lines=True)
    question = {
        "id": "multi_turn_base_0",
        "question": [[{"role": "user", "content": f"turn {t}"}] for t in range(len(gold))],
        "initial_config": FS_STATE,
        "involved_classes": list(classes),
    }
    return bfcl_files(
        tmp_path, "BFCL_v4_multi_turn_base.json", [question], [{"id": "multi_turn_base_0", "ground_truth": gold}]
    )


def test_executed_bfcl_calls_carry_their_results_in_the_state_earlier_turns_left(tmp_path):
    gold = [["cd(folder='docs')"], [], ["ls()", "cat('a.txt')", "cat(file_name='b.txt')"]]
    imported = import_bfcl(executed_conversation(tmp_path, gold), execute=True)
    first, third = imported.examples
    assert [json.loads(s.result) for s in first.steps] == [{"current_working_directory": "docs"}]
    listing, content, missing = (s.result for s in third.steps)
    assert json.loads(listing) == {"current_directory_content": ["a.txt"]}  # still in docs: the state carried on
    assert json.loads(content) == {"file_content": "hi"}
    assert "b.txt" in json.loads(missing)["error"]  # a tool's own error is its result
    assert all(
        s.result is None for e in import_bfcl(tmp_path / "BFCL_v4_multi_turn_base.json").examples for s in e.steps
    )


def test_executing_bfcl_calls_refuses_unknown_classes_and_says_how_to_install_the_backends(tmp_path, monkeypatch):
    path = executed_conversation(tmp_path, [["cd(folder='docs')"]], classes=("GorillaFileSystem", "Shell"))
    with pytest.raises(DataError, match=r"record 0: field 'involved_classes': expected a list of GorillaFileSystem"):
        import_bfcl(path, execute=True)
    monkeypatch.setitem(sys.modules, f"{BACKENDS}.gorilla_file_system", None)  # as if not installed
    path = executed_conversation(tmp_path / "again", [["cd(folder='docs')"]])
    with pytest.raises(DataError, match=r"needs BFCL's simulated backends .*pip install --no-deps bfcl-eval=="):
        import_bfcl(path, execute=True)


def test_bfcl_call_strings_are_parsed_with_positional_arguments_in_schema_order():
    assert parse_call("mv('a', 'b')", "f: record 0", "g", DOCS) == ("mv", {"source": "a", "destination": "b"})
    assert parse_call(" cd(folder='x') ", "f: record 0", "g", DOCS) == ("cd", {"folder": "x"})
    assert parse_call("post(content='hi', tags=['#a', \"#b\"])", "w", "g", DOCS) == (
        "post",
        {"content": "hi", "tags": ["#a", "#b"]},
    )
    assert parse_call("rm('a')", "w", "g", DOCS) == ("rm", None)  # no schema: the caller skips it


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("cd(folder='x'", "not a Python call"),
        ("cd", "expected a call"),
        ("(lambda: 1)()", "expected a call"),
        ("cd(folder=__import__('os').getcwd())", "is not a literal value"),
        ("cd(folder=name)", "is not a literal value"),
        ("mv('a', 'b', 'c')", "3 positional arguments, but 'mv' has 2 parameters"),
        ("mv('a', source='b')", "argument 'source' given twice"),
        ("cd(**{'folder': 'x'})", "**kwargs"),
    ],
)
def test_a_bad_call_string_is_refused_not_evaluated(text, problem):
    with pytest.raises(DataError) as caught:
        parse_call(text, "answers.json: record 3", "ground_truth[1][0]", DOCS)
    message = str(caught.value)
    assert message.startswith("answers.json: record 3, field 'ground_truth[1][0]': ") and problem in message


def test_a_multi_turn_answer_with_the_wrong_number_of_turns_is_refused(multi_turn_file):
    answers = multi_turn_file.parent / "possible_answer" / multi_turn_file.name
    write_json(answers, [{"id": "multi_turn_base_0", "ground_truth": [["cd(folder='docs')"]]}], lines=True)
    with pytest.raises(DataError, match=r"record 0, field 'ground_truth': has 1 turns, the question has 4"):
        import_bfcl(multi_turn_file)


def test_a_bfcl_folder_imports_every_answered_question_file_and_counts_the_others(multi_turn_file, parallel_file):
    write_json(
        multi_turn_file.parent / "BFCL_v4_irrelevance.json",
        [bfcl_question("irrelevance_0", "Hi.", [WEATHER])],
        lines=True,
    )
    imported = import_bfcl(multi_turn_file.parent)
    assert imported.records == 4 and len(imported.examples) == 4
    assert imported.skipped["question files with no possible_answer file (left out of a folder import)"] == 1
    with pytest.raises(DataError, match="no gold answers"):
        import_bfcl(multi_turn_file.parent / "BFCL_v4_irrelevance.json")


# ---- xLAM ----------------------------------------------------------------------------------------------------


def test_xlam_import_keeps_records_with_calls_and_counts_those_without(tmp_path):
    tool = {"name": "square", "description": "Square.", "parameters": {"x": {"type": "int"}}}
    records = [
        {"id": 7, "query": "Square 3.", "answers": [{"name": "square", "arguments": {"x": 3}}], "tools": [tool]},
        {"id": 8, "query": "Sing.", "answers": "[]", "tools": json.dumps([tool])},
    ]
    imported = import_xlam(write_json(tmp_path / "xlam.json", records))
    [example] = imported.examples
    assert example.id == "7" and example.steps[0].response == call_json("square", {"x": 3})
    assert imported.catalog == {"square": tool}
    assert imported.skipped == {"records with no calls": 1}


# ---- the command ---------------------------------------------------------------------------------------------


def test_data_import_writes_procedures_and_a_catalog_the_other_commands_read(nestful_file, tmp_path, capsys):
    out, catalog, report = tmp_path / "out" / "cfb.jsonl", tmp_path / "out" / "tools.jsonl", tmp_path / "import.json"
    assert (
        main(
            [
                "data",
                "import",
                "--format",
                "nestful",
                str(nestful_file),
                "--out",
                str(out),
                "--catalog",
                str(catalog),
                "--json",
                str(report),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for line in (
        "read 4 records",
        "wrote 2 examples (3 calls)",
        "calls per example: 1: 1, 2: 1",
        "tools: 2",
        "1 records calling a tool with no schema",
        "1 records with no calls",
    ):
        assert line in printed
    assert load_examples(out) == import_nestful(nestful_file).examples
    assert load_catalog(catalog) == {
        "Search_Hotel_Destination": "Find a destination.",
        "Search_Hotels": "Search hotels.",
    }
    assert json.loads(catalog.read_text().splitlines()[1]) == import_nestful(nestful_file).catalog["Search_Hotels"]
    numbers = json.loads(report.read_text())
    assert numbers["calls_per_example"] == {"1": 1, "2": 1} and numbers["skipped"]["records with no calls"] == 1


def test_data_import_of_a_malformed_file_is_a_one_line_error_and_writes_nothing(tmp_path, capsys):
    write_json(tmp_path / "x-spec.json", SPEC)
    path = write_json(tmp_path / "x-data.json", [HOTELS, {"input": "q"}])
    out = tmp_path / "out.jsonl"
    assert main(["data", "import", "--format", "nestful", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: record 1, field 'output'" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["data", "import", "--format", "bfcl", str(path), "--out", str(out), "--tools", str(path)]) == 2
    assert "--tools is for --format nestful" in capsys.readouterr().err
    assert main(["data", "import", "--format", "nestful", str(path), "--out", str(out), "--execute"]) == 2
    assert "--execute is for --format bfcl" in capsys.readouterr().err


def test_data_import_execute_writes_bfcl_turns_with_their_results(tmp_path, capsys):
    path = executed_conversation(tmp_path, [["cd(folder='docs')", "ls()"]])
    out, report = tmp_path / "turns.jsonl", tmp_path / "counts.json"
    assert (
        main(["data", "import", "--format", "bfcl", str(path), "--out", str(out), "--execute", "--json", str(report)])
        == 0
    )
    (turn,) = load_examples(out)
    assert [json.loads(s.result) for s in turn.steps] == [
        {"current_working_directory": "docs"},
        {"current_directory_content": ["a.txt"]},
    ]
    assert json.loads(report.read_text())["executed"] is True


# ---- the shared real files -----------------------------------------------------------------------------------


@needs_shared
def test_the_real_complexfuncbench_and_bfcl_multi_turn_files_import_whole():
    def references(imported):
        return [
            a
            for e in imported.examples
            for _, call in steps(e)
            for a in call["arguments"].values()
            if isinstance(a, str) and a.startswith("$var")
        ]

    cfb = import_nestful(SHARED / "complexfuncbench" / "complexfuncbench-data.json.gz")
    assert cfb.records == len(cfb.examples) == 786 and not cfb.skipped
    assert len(cfb.catalog) == 38 and min(cfb.calls_per_example()) == 2
    kept = references(import_nestful(SHARED / "complexfuncbench" / "complexfuncbench-data.json.gz", results=False))
    assert kept and all(a.endswith("$") for a in kept)
    assert not references(cfb)  # with results, every reference names a value in its recorded response
    bfcl = import_bfcl(SHARED / "bfcl" / "BFCL_v4_multi_turn_base.json")
    assert bfcl.records == 200 and len(bfcl.examples) + bfcl.skipped["turns with no calls"] == 734
    assert set(bfcl.catalog) <= set(import_bfcl(SHARED / "bfcl").catalog) and len(bfcl.catalog) == 81
    assert not set(bfcl.catalog) & set(cfb.catalog)
    executed = import_bfcl(SHARED / "bfcl" / "BFCL_v4_multi_turn_base.json", execute=True)
    results = [s.result for e in executed.examples for s in e.steps]
    assert [e.steps for e in executed.examples] != [e.steps for e in bfcl.examples] and len(results) == 1142
    assert all(r is not None and not r.startswith("Error during execution") for r in results)  # every gold call runs


def import_and_train(nestful_file, tmp_path) -> tuple[Path, Path]:
    """The CLI's import of the NESTFUL sample (with its catalog), then a one-epoch bank on it: (the data, the bank)."""
    out, catalog, bank = tmp_path / "cfb.jsonl", tmp_path / "tools.jsonl", tmp_path / "bank.safetensors"
    assert (
        main(["data", "import", "--format", "nestful", str(nestful_file), "--out", str(out), "--catalog", str(catalog)])
        == 0
    )
    assert (
        main(
            [
                "train",
                "--data",
                str(out),
                "--catalog",
                str(catalog),
                "--out",
                str(bank),
                "--backbone",
                "tiny-random",
                "--device",
                "cpu",
                "--epochs",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    return out, bank


def test_import_then_train_then_eval_reports_tool_argument_and_call_f1(nestful_file, tmp_path, capsys):
    out, bank = import_and_train(nestful_file, tmp_path)
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--bank",
                str(bank),
                "--data",
                str(out),
                "--max-new-tokens",
                "8",
                "--device",
                "cpu",
                "--json",
                str(tmp_path / "eval.json"),
            ]
        )
        == 0
    )
    assert "Argument F1" in (printed := capsys.readouterr().out) and "Routing F1" in printed
    calls = json.loads((tmp_path / "eval.json").read_text())["calls"]
    scores = {"tool_f1", "arg_f1", "call_f1", "routing_f1"}  # by position: the k-th call against the k-th gold call
    assert set(calls) == scores | {"exact_steps", "steps"} and set(calls["tool_f1"]) == {"1", "2", "all"}
    assert all(0 <= calls[m][n] <= 100 for m in scores for n in calls[m])
    assert 0 <= calls["exact_steps"]["all"] <= calls["steps"]["all"]


# ---- OpenAI chat format --------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Weather now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def openai_record(*messages, tools=(WEATHER_TOOL,)):
    return {"messages": list(messages), "tools": list(tools)}


def assistant_calls(*calls):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            for call_id, name, arguments in calls
        ],
    }


OSLO_THEN_ROME = openai_record(
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo and Rome?"},
    assistant_calls(("c1", "weather", {"city": "Oslo"}), ("c2", "weather", {"city": "Rome"})),
    {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    {"role": "assistant", "content": "Rain in Oslo, sun in Rome."},
    {"role": "user", "content": "And Paris?"},
    assistant_calls(("c3", "weather", {"city": "Paris"})),
)


def test_openai_records_become_calls_with_results_matched_by_tool_call_id(tmp_path):
    imported = import_openai(
        write_json(
            tmp_path / "chat.jsonl",
            [
                OSLO_THEN_ROME,
                openai_record({"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"}),
            ],
            lines=True,
        )
    )
    [example] = imported.examples
    assert example.query == "Weather in Oslo and Rome?"
    assert steps(example) == [
        ("weather", {"name": "weather", "arguments": {"city": "Oslo"}}),
        ("weather", {"name": "weather", "arguments": {"city": "Rome"}}),
    ]
    assert [s.result for s in example.steps] == ["rain", "sunny"]
    assert example.answer == "Rain in Oslo, sun in Rome."  # the assistant's words after the results
    assert imported.catalog["weather"] == {
        "name": "weather",
        "description": "Weather now.",
        "parameters": WEATHER_TOOL["function"]["parameters"],
    }
    assert imported.skipped == {"records with no calls": 1, LATER_TURNS: 1}


@pytest.mark.parametrize(
    "record, field",
    [
        ({"tools": []}, "messages"),
        (openai_record({"role": "user", "content": "q"}, {"role": "robot"}), "messages[1].role"),
        (
            openai_record(
                {"role": "user", "content": "q"},
                assistant_calls(("c1", "weather", {}))
                | {"tool_calls": [{"id": "c1", "function": {"name": "weather", "arguments": "{not json"}}]},
            ),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            openai_record({"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {}}]}),
            "messages[1].tool_calls[0].function.name",
        ),
        (
            openai_record(
                {"role": "user", "content": "q"},
                assistant_calls(("c1", "weather", {"city": "x"})),
                {"role": "tool", "tool_call_id": "zz", "content": "r"},
            ),
            "messages",
        ),
        (openai_record({"role": "user", "content": "q"}, tools=[{"type": "function"}]), "tools[0]"),
    ],
)
def test_a_bad_openai_record_is_refused_naming_file_record_and_field(tmp_path, record, field):
    path = write_json(tmp_path / "chat.jsonl", [OSLO_THEN_ROME, record], lines=True)
    with pytest.raises(DataError, match=rf"chat.jsonl: record 1, field '{field.replace('[', '.').replace(']', '.')}'"):
        import_openai(path)


def test_data_import_reads_the_openai_format(tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    path = write_json(tmp_path / "chat.jsonl", [OSLO_THEN_ROME], lines=True)
    assert main(["data", "import", "--format", "openai", str(path), "--out", str(out)]) == 0
    assert [s.result for s in load_examples(out)[0].steps] == ["rain", "sunny"]


def test_train_keeps_the_catalogs_schemas_in_the_bank_and_bank_show_prints_them(nestful_file, tmp_path, capsys):
    bank = import_and_train(nestful_file, tmp_path)[1]
    schema = import_nestful(nestful_file).catalog["Search_Hotels"]["parameters"]
    assert MemoryBank.load(bank).tool_schemas()["Search_Hotels"] == schema
    capsys.readouterr()
    assert main(["bank", "show", str(bank)]) == 0
    assert f"Search_Hotels arguments schema: {json.dumps(schema)}" in capsys.readouterr().out
    for switch in ([], ["--no-schema"]):
        assert (
            main(
                [
                    "run",
                    "--bank",
                    str(bank),
                    "Find hotels in Rome.",
                    "--max-new-tokens",
                    "8",
                    "--device",
                    "cpu",
                    *switch,
                ]
            )
            == 0
        )
