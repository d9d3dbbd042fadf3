"""Make a venv that sees the packages of other venvs: their union, without a second install.

    python requirements/union_venv.py .venv .venv-jax .venv-tensorflow

`make test` needs JAX alone, TensorFlow alone, and both together. The two
single-backend venvs are pinned by requirements/constraints.txt, so the
both-backends install is exactly their union; instead of a third `pip
install` of about 2.5 GB (the longest of the three, run while the others
install), the target venv gets one `.pth` file that adds each source venv's
site-packages with `site.addsitedir` (so their own `.pth` files, keras_dist's
editable install among them, are read too).

It first checks that every distribution found in more than one source venv
has the same version in each (else the union would depend on the order) and
exits with one clear error naming them; then writes the `.pth` file through
a temporary file and a rename. `pip check` in the target venv afterwards
checks that the union satisfies every requirement.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

PTH_NAME = "keras_dist_union.pth"


def _site_packages_and_versions(venv: pathlib.Path) -> tuple[str, dict[str, str]]:
    probe = (
        "import json, sysconfig, importlib.metadata as m;"
        "print(json.dumps([sysconfig.get_path('purelib'),"
        " {d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()"
        "  if d.metadata['Name']}]))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], check=True, capture_output=True, text=True)
    site_packages, versions = json.loads(out.stdout)
    return site_packages, versions


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    target, *sources = (pathlib.Path(a) for a in argv)
    found = [_site_packages_and_versions(s) for s in sources]
    seen: dict[str, dict[str, str]] = {}
    for source, (_, versions) in zip(sources, found):
        for name, version in versions.items():
            seen.setdefault(name, {})[str(source)] = version
    clashes = {n: v for n, v in seen.items() if len(set(v.values())) > 1}
    if clashes:
        lines = [f"  {n}: " + ", ".join(f"{ver} in {src}" for src, ver in v.items()) for n, v in sorted(clashes.items())]
        print(
            f"union_venv: the venvs disagree on versions, so {target} cannot be their union:\n"
            + "\n".join(lines)
            + "\nPin them to one version in requirements/constraints.txt and rebuild the venvs.",
            file=sys.stderr,
        )
        return 1
    target_site, _ = _site_packages_and_versions(target)
    text = "import site; " + "; ".join(f"site.addsitedir({site!r})" for site, _ in found) + "\n"
    pth = pathlib.Path(target_site) / PTH_NAME
    tmp = pth.with_suffix(".pth.tmp")
    tmp.write_text(text)
    os.replace(tmp, pth)
    print(f"union_venv: {target} sees {', '.join(map(str, sources))} ({len(seen)} distributions)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
