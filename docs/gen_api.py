"""Writes docs/pages/api/*.md: one section per public name of keras_dist and
its public subpackages (their `__all__`), each rendered by mkdocstrings from
the object's own docstring where it is defined; names that are the same
object as one documented earlier (tf.distribute.experimental's spellings)
say so and link there.

    KERAS_BACKEND=jax python docs/gen_api.py          # write the pages
    KERAS_BACKEND=jax python docs/gen_api.py --check  # exit 1 if they are stale

It imports keras_dist (and so Keras and a backend): `make docs` builds from
the checked-in pages without one; tests/test_docs.py runs `--check`.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import sys

PAGES = pathlib.Path(__file__).parent / "pages" / "api"
#: page -> (module, blurb)
MODULES = {
    "keras_dist": ("keras_dist", "Strategies, distributed values and input, replica contexts, losses, cross-device ops."),
    "experimental": ("keras_dist.experimental", "tf.distribute.experimental's spellings, and the names only it has."),
    "cluster_resolver": ("keras_dist.cluster_resolver", "Where a job's tasks are: TF_CONFIG, torchrun, SLURM, GCE, Kubernetes, TPU."),
    "coordinator": ("keras_dist.coordinator", "Scheduling functions on parameter-server workers."),
    "callbacks": ("keras_dist.callbacks", "Is distributing paying off?"),
}


def _public_names(module):
    subpackages = set(getattr(module, "_SUBPACKAGES", ())) | set(getattr(module, "_SUBMODULES", ()))
    return [name for name in module.__all__ if name not in subpackages]


def _anchor(public: str) -> str:
    return public.replace(".", "").lower()


def pages() -> dict[str, str]:
    documented: dict[int, tuple[str, str]] = {}  # id(object) -> (page, public name)
    out = {}
    for page, (module_name, blurb) in MODULES.items():
        module = importlib.import_module(module_name)
        lines = [f"# {module_name}", "", blurb, ""]
        for name in _public_names(module):
            obj = getattr(module, name)
            public = f"{module_name}.{name}"
            lines += [f"## `{public}` {{#{_anchor(public)}}}", ""]
            if id(obj) in documented:
                where, first = documented[id(obj)]
                link = f"{where}.md#{_anchor(first)}" if where != page else f"#{_anchor(first)}"
                lines += [f"The same object as [`{first}`]({link}).", ""]
                continue
            documented[id(obj)] = (page, public)
            if inspect.ismodule(obj):
                path = obj.__name__
            else:
                path = f"{obj.__module__}.{obj.__qualname__}"
            lines += [f"::: {path}", "    options:", "      show_root_heading: false", "      heading_level: 3", ""]
        out[page] = "\n".join(lines)
    return out


def main(argv) -> int:
    written = pages()
    if "--check" in argv:
        stale = [page for page, text in written.items()
                 if not (PAGES / f"{page}.md").exists() or (PAGES / f"{page}.md").read_text() != text]
        extra = sorted(p.stem for p in PAGES.glob("*.md") if p.stem not in written)
        if stale or extra:
            print(f"docs/pages/api is stale ({', '.join(stale + extra)}): run `KERAS_BACKEND=jax python docs/gen_api.py`")
            return 1
        return 0
    PAGES.mkdir(parents=True, exist_ok=True)
    for page, text in written.items():
        (PAGES / f"{page}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
