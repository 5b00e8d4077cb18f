"""CLI: ``dreamgym env play`` (a person plays an episode), ``dreamgym env serve`` (AgentGym protocol) and
``dreamgym env serve-web`` (the shop as a website, for the browser env)."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

env_app = typer.Typer(help="Play or serve environments.", no_args_is_help=True)
console = Console()


def split_option(value: str) -> str:
    """``--split``: train | val | test (anything else is a one-line error before any env is made)."""
    from dreamgym.envs.base import check_split

    return check_split(value)


def parse_env_args(pairs: list[str] | None) -> dict[str, Any]:
    """``["num_products=1000", "name=x"]`` -> kwargs, with ints/floats/bools parsed."""
    import yaml

    out: dict[str, Any] = {}
    for p in pairs or []:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg expects key=value, got {p!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


@env_app.command("list")
def list_envs() -> None:
    """List the registered environments."""
    from dreamgym.envs import registered

    for name in registered():
        console.print(name)


@env_app.command("play")
def play(
    name: str = typer.Argument("shop", help="registered env name"),
    split: str = typer.Option("test", help="task split: train | val | test", callback=split_option),
    seed: int = typer.Option(0, help="episode seed"),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="env constructor argument key=value"),
) -> None:
    """Play one episode in the terminal: type an action (or its number), `q` to quit."""
    from dreamgym.envs import make

    env = make(name, **parse_env_args(env_arg))
    obs, info = env.reset(seed=seed, options={"split": split})
    task = info["task"]
    if task is not None:
        console.print(f"[bold]Task:[/bold] {task.instruction}")
    total = 0.0
    while True:
        console.print(obs, highlight=False, markup=False)
        actions = info.get("admissible_actions", [])
        for i, a in enumerate(actions):
            console.print(f"  {i:>2}. {a}", highlight=False, markup=False)
        raw = typer.prompt("action").strip()
        if raw in {"q", "quit", "exit"}:
            break
        action = actions[int(raw)] if raw.isdigit() and int(raw) < len(actions) else raw
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        if info.get("invalid_action"):
            console.print("[yellow]invalid action[/yellow]")
        if terminated or truncated:
            console.print(obs, highlight=False, markup=False)
            console.print(f"[bold]done[/bold] reward={reward:.3f} success={info.get('success')} steps={env.steps}")
            break
    env.close()


@env_app.command("serve")
def serve(
    name: str = typer.Argument(..., help="registered env name"),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port"),
    host: str = typer.Option("127.0.0.1", help="interface to bind (0.0.0.0 exposes it to the network)"),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="env constructor argument key=value"),
    max_sessions: int = typer.Option(256, min=1, help="most env sessions at once (more get 503)"),
    idle_timeout: float = typer.Option(1800.0, min=0, help="close sessions idle this many seconds (0: never)"),
    api_key_env: str | None = typer.Option(None, help="env var holding the API key clients must send (Bearer)"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve an env over AgentGym's env-server HTTP protocol (POST /create, /reset, /step, /close, ...)."""
    import os

    from dreamgym.envs.server import create_app
    from dreamgym.envs.server import serve as run_server

    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {api_key_env}: the environment variable is unset or empty")
    app = create_app(name, parse_env_args(env_arg), max_sessions=max_sessions, idle_timeout_s=idle_timeout or None,
                     api_key=api_key)
    url = f"http://{host}:{port}"
    console.print(f"serving {name!r} on {url} (AgentGym protocol; WebShop dialect: {url}/webshop)", soft_wrap=True)
    run_server(app, host=host, port=port, log_level=log_level)


@env_app.command("serve-web")
def serve_web(
    name: str = typer.Argument("shop", help="the site to serve: shop"),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port"),
    host: str = typer.Option("127.0.0.1", help="interface to bind (0.0.0.0 exposes it to the network)"),
    env_arg: list[str] = typer.Option(None, "--env-arg", help="shop argument key=value (num_products=100, ...)"),
    max_sessions: int = typer.Option(10_000, min=1, help="most sessions kept (the oldest go first)"),
    log_level: str = typer.Option("warning", help="uvicorn log level"),
) -> None:
    """Serve the text shop as a real website (HTML pages, forms and links) for make("browser", start_url=URL)."""
    from dreamgym.envs.server import serve as run_server
    from dreamgym.envs.web.site import ShopSiteConfig, create_site

    if name != "shop":
        raise ValueError(f"serve-web: unknown site {name!r}; the built-in site is: shop")
    app = create_site(ShopSiteConfig.from_kwargs(parse_env_args(env_arg)), max_sessions=max_sessions)
    url = f"http://{host}:{port}"
    console.print(f"serving the shop site on {url} (episodes start at {url}/start?task=TASK_ID; "
                  f"results at {url}/api/result?session=ID)", soft_wrap=True)
    run_server(app, host=host, port=port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")
