"""Every setting of ``tokmem serve``, defined once: the command's flags are generated from ``ServeConfig``.

The defaults are safe on an open network: loopback only, bounded prompts, bodies, queues, connections
and read times.  With ``api_key`` set, bank management needs it (``protect="manage"``) or every ``/v1``
route does (``protect="all"``); ``exposure_warning`` says when management is open beyond this machine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

from tokmem.backbones import backbone_option, device_option
from tokmem.config import option
from tokmem.decoding.decode import DecodeConfig
from tokmem.schemas import Budget


@dataclass
class ServeConfig:
    banks: str = field(metadata={"help": "folder of banks: NAME.safetensors + NAME.safetensors.json"})
    backbone: str = backbone_option("the frozen backbone the banks were trained for")
    host: str = option("127.0.0.1", "address to listen on (default: loopback only)")
    port: int = option(8000, "port to listen on")
    api_key: str | None = option(None, "bearer token that protected routes need (see --protect)")
    protect: Literal["manage", "all"] = option(
        "manage", "with --api-key: 'manage' = PUT/DELETE /v1/banks need the key; 'all' = every /v1 route does"
    )
    device: str | None = device_option()
    seed: int = option(0, "seed of the sampler (requests with temperature > 0)")
    # the engine and the bank registry
    max_batch: int = option(32, "rows decoded together")
    max_queue: int = option(256, "waiting requests; more get 429")
    max_resident: int = option(256, "banks kept loaded (least recently used leave)")
    # per request
    max_prompt_chars: int = option(65_536, "characters of prompt text, checked before tokenising; more get 400")
    max_prompt_tokens: int = option(2048, "tokens of the chat-formatted prompt; more get 400")
    max_new_tokens: int = option(1024, "the most tokens a request may ask for")
    default_max_tokens: int = option(DecodeConfig.max_new_tokens, "tokens answered when a request does not say")
    timeout: float = option(120.0, "seconds per request, queueing included; then 504")
    bank_tools: bool = option(
        False,
        "a chat request that lists no tools may call its bank's own tools (off: as OpenAI's API, no tools offered, "
        "no tool calls; a request's bank_tools overrides)",
    )
    # JSON schemas: compiled at the door, off the decoding thread; a client's within this budget
    schema_seconds: float = option(
        5.0,
        "seconds a client's schema (request tools, response_format, an uploaded bank) may take to compile; then 400",
    )
    max_schema_chars: int = option(Budget.max_chars, "characters of one JSON schema; a larger one gets 400")
    # connections
    max_body_mb: float = option(8.0, "request body limit in MiB; larger bodies get 413")
    header_timeout: float = option(10.0, "seconds a connection may take to send a request's headers; then it is closed")
    body_timeout: float = option(30.0, "seconds a request may take to send its body; then 408")
    keep_alive: int = option(5, "seconds an idle keep-alive connection stays open")
    max_connections: int = option(512, "open connections and running requests at once; more get 503")

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * 2**20)

    @property
    def schema_budget(self) -> Budget:
        return Budget(seconds=self.schema_seconds, max_chars=self.max_schema_chars)


def exposure_warning(config: ServeConfig) -> str | None:
    """A warning when anyone who can reach the server may upload or delete banks, else None."""
    if config.api_key or _loopback(config.host):
        return None
    return (
        f"bank management (PUT/DELETE /v1/banks) is open to anyone who can reach {config.host}:{config.port}; "
        "pass --api-key to protect it"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
