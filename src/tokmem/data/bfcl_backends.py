"""BFCL's simulated backends: the multi-turn gold calls run, so that each call carries the result its tool returns.

BFCL's multi-turn categories come with the tools' implementations — a file system, a trading bot, travel booking,
messaging, … (the ``bfcl-eval`` wheel's ``func_source_code`` modules, plain Python; installed without its
dependencies, as ``make install`` does) — and each conversation's ``initial_config``, the state its classes start in.
A `Conversation` loads its ``involved_classes`` from that state and runs calls by name, in order, so that a turn sees
the state earlier turns left (the directory after ``cd``, a login's token).  A call that fails gives BFCL's own
error text as its result, as a real tool's error would be shown to the model.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json

from tokmem.errors import DataError

INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
BACKENDS = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS = frozenset({"MathAPI"})  # no scenario to load (BFCL's STATELESS_CLASSES)


class Conversation:
    """The tools of one BFCL multi-turn conversation, each class loaded with its part of ``initial_config``."""

    def __init__(self, classes: list, initial_config: dict, where: str):
        if not isinstance(classes, list) or not all(name in MODULES for name in classes):
            raise DataError(f"{where}: field 'involved_classes': expected a list of {', '.join(MODULES)}")
        if not isinstance(initial_config, dict):
            raise DataError(f"{where}: field 'initial_config': expected an object")
        self.methods = {}
        for name in classes:
            instance = getattr(_module(name), name)()
            if name not in STATELESS:
                instance._load_scenario(copy.deepcopy(initial_config.get(name, {})))
            self.methods.update(
                (method, bound)
                for method, bound in inspect.getmembers(instance, inspect.ismethod)
                if not method.startswith("_")
            )

    def run(self, tool: str, arguments: dict | None) -> str | None:
        """The result of calling ``tool`` as text (JSON where it is an object), BFCL's error text where the call
        fails; None for a tool no class of the conversation has, or with unnamed arguments (not run)."""
        if tool not in self.methods or arguments is None:
            return None
        try:
            result = self.methods[tool](**arguments)
        except Exception as err:  # the tool's own failure is its result, as BFCL shows it
            return f"Error during execution: {err}"
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)


def _module(name: str):
    try:
        return importlib.import_module(f"{BACKENDS}.{MODULES[name]}")
    except ImportError as err:
        raise DataError(f"running BFCL's multi-turn calls needs BFCL's simulated backends ({err}): {INSTALL}") from None
