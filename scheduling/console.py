"""Terminal output of the management commands: progress bars (rich), quiet off a terminal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)


@contextmanager
def progress(description: str, total: float | None) -> Iterator[Callable[..., None]]:
    """Show a progress bar on stderr while the body runs; yield ``advance(n=1, note="")``.

    ``total`` is in the caller's unit (runs, slots, percent); None shows a bar without an end.
    Nothing is drawn when stderr is not a terminal (CI, pipes, tests).
    """
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
        transient=False,
    )
    with bar:
        task = bar.add_task(description, total=total, note="")

        def advance(n: float = 1, note: str = "") -> None:
            bar.update(task, advance=n, note=note)

        yield advance
