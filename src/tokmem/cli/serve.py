"""``tokmem serve``: the OpenAI-compatible HTTP server for the banks in a directory."""

from __future__ import annotations

from tokmem.backbones import DEFAULT_BACKBONE
from tokmem.report import console


def add_commands(commands) -> None:
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server for the banks in a directory")
    serve.add_argument("--banks", required=True, metavar="DIR", help="folder of banks: NAME.safetensors + NAME.safetensors.json")
    serve.add_argument("--backbone", default=DEFAULT_BACKBONE)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", help="bearer token that PUT and DELETE /v1/banks/NAME require")
    serve.add_argument("--max-batch", type=int, default=32, help="rows decoded together")
    serve.add_argument("--max-queue", type=int, default=256, help="waiting requests; more get 429")
    serve.add_argument("--max-resident", type=int, default=256, help="banks kept loaded (least recently used leave)")
    serve.add_argument("--max-prompt-tokens", type=int, default=2048)
    serve.add_argument("--max-new-tokens", type=int, default=1024, help="the most a request may ask for")
    serve.add_argument("--max-body-mb", type=float, default=8.0, help="request body limit; larger bodies get 413")
    serve.add_argument("--timeout", type=float, default=120.0, help="seconds per request, queueing included")
    serve.add_argument("--device", help="cpu, cuda, … (default: cuda when available)")
    serve.add_argument("--seed", type=int, default=0, help="seed of the sampler (requests with temperature > 0)")
    serve.set_defaults(handler=cmd_serve, extra="serve")


def cmd_serve(args) -> None:
    import uvicorn

    from tokmem.backbones import load_backbone
    from tokmem.serve.api import Limits, create_app
    from tokmem.serve.banks import BankRegistry
    from tokmem.serve.engine import Engine

    backbone = load_backbone(args.backbone, device=args.device)
    registry = BankRegistry(backbone, args.banks, max_resident=args.max_resident)
    engine = Engine(backbone, max_batch=args.max_batch, max_queue=args.max_queue, seed=args.seed)
    limits = Limits(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                    max_body_bytes=int(args.max_body_mb * 2**20), timeout=args.timeout)
    console.print(f"serving {len(registry.names())} banks from {args.banks} on {backbone.name}: http://{args.host}:{args.port}/v1")
    uvicorn.run(create_app(registry, engine, limits, api_key=args.api_key), host=args.host, port=args.port)
