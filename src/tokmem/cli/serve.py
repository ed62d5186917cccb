"""``tokmem serve``: the OpenAI-compatible HTTP server for the banks in a directory (flags from ``ServeConfig``)."""

from __future__ import annotations

from rich.markup import escape

from tokmem.cli.options import add_options, values
from tokmem.report import console, error_console
from tokmem.serve.config import ServeConfig, exposure_warning


def add_commands(commands) -> None:
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server for the banks in a directory")
    add_options(serve, ServeConfig)
    serve.set_defaults(handler=cmd_serve, extra="serve")


def cmd_serve(args) -> None:
    from tokmem.backbones import load_backbone
    from tokmem.serve import server

    config = ServeConfig(**values(args, ServeConfig))
    backbone = load_backbone(config.backbone, device=config.device)
    console.print(f"serving the banks in {config.banks} on {backbone.name}: http://{config.host}:{config.port}/v1")
    warning = exposure_warning(config)
    if warning:
        error_console.print(f"[bold yellow]warning:[/bold yellow] {escape(warning)}", highlight=False)
    server.run(config, backbone)
