"""Mutation testing with mutmut: per-module kill rates for the op, the masks, checkpoint writing
and the HF adapter, each module against the tests that cover it.

    python benchmarks/mutate.py                      # every module, every mutant
    python benchmarks/mutate.py ops masks            # some modules
    python benchmarks/mutate.py --sample 5           # every 5th mutant (by number), to fit a budget
    python benchmarks/mutate.py --committed          # the last commit, not the working tree
    python benchmarks/mutate.py checkpoint --resume  # go on where a --budget stopped
    python benchmarks/mutate.py --report             # only print the table of the last run
    python benchmarks/mutate.py --survivors ops      # list the surviving mutants of a module

Each module runs in its own copy of the tree, build/mutate/<module>/ (src, tests and a
pyproject.toml whose [tool.mutmut] names that module and its tests), so that its mutants are
tried only against its own tests and a tree others are editing is read once, at the start.
Inside a copy mutmut works as usual: mutants under mutants/, and for each mutant only the
tests that reach the mutated function run, stopping at the first failure.

Kill rate = (killed + timed out) / tried: a mutant that makes its tests hang past mutmut's CPU-time
limit is caught too. Mutants no test reaches count as survivors. A run cut short (--budget) counts
what it tried and reports the rest as not run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "mutate"


@dataclass(frozen=True)
class Module:
    name: str
    mutate: tuple[str, ...]  # only_mutate globs
    tests: tuple[str, ...]  # the tests that cover it


MODULES = {
    m.name: m for m in [
        Module("ops", ("src/attnlab/ops/*",),
               ("tests/ops", "tests/test_properties.py", "tests/test_errors.py")),
        Module("masks", ("src/attnlab/masks/*",),
               ("tests/masks", "tests/ops/test_tiled.py", "tests/ops/test_tiled_auto.py",
                "tests/ops/test_semantics.py", "tests/ops/test_accuracy.py",
                "tests/test_properties.py")),
        Module("checkpoint", ("src/attnlab/models/checkpoint.py",),
               ("tests/models/test_gpt_checkpoint.py", "tests/models/test_atomic_write.py",
                "tests/models/test_checkpoint_trust.py")),
        Module("hf", ("src/attnlab/adapters/hf.py",),
               ("tests/adapters/test_hf_adapter.py", "tests/adapters/test_hf_masks.py",
                "tests/adapters/test_architectures.py")),
    ]
}

# mutmut's exit codes (mutmut.stats.status_by_exit_code)
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          35: "suspicious", 36: "timeout", 37: "killed", -24: "timeout", 24: "timeout",
          152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault", None: "not checked"}


def _config(m: Module) -> str:
    """pyproject.toml with a [tool.mutmut] for this module alone."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    text = re.sub(r"\n\[tool\.mutmut\]\n.*?(?=\n\[)", "\n", text, flags=re.S)
    q = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    return text + (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        'process_isolation = "forkserver"\n'  # torch is not fork-safe: plain fork can deadlock
        f"only_mutate = {q(m.mutate)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-m", "not slow"]\n'
        f"pytest_add_cli_args_test_selection = {q(t for t in m.tests if (ROOT / t).exists())}\n"
    )


def prepare(m: Module, committed: bool) -> Path:
    d = WORK / m.name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if committed:  # the last commit, whatever the working tree holds
        tar = subprocess.run(["git", "archive", "HEAD", "src", "tests", "README.md"], cwd=ROOT,
                             capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(d)], input=tar, check=True)
    else:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(ROOT / "src", d / "src", ignore=ignore)
        shutil.copytree(ROOT / "tests", d / "tests", ignore=ignore)
        shutil.copy2(ROOT / "README.md", d / "README.md")
    (d / "pyproject.toml").write_text(_config(m), encoding="utf-8")
    return d


def run(m: Module, sample: int, children: int, budget: float | None, committed: bool,
        resume: bool) -> None:
    d = WORK / m.name
    if resume and (d / "run.json").exists():  # mutmut skips the mutants it already has results for
        info = json.loads((d / "run.json").read_text(encoding="utf-8"))
        sample = info["sample"]
    else:
        d = prepare(m, committed)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
        info = {"sample": sample, "commit": commit + ("" if committed else " + working tree"),
                "started": time.strftime("%Y-%m-%d %H:%M")}
        (d / "run.json").write_text(json.dumps(info), encoding="utf-8")
    names = [f"*__mutmut_*{i}" for i in range(10) if i % sample == 0] if sample > 1 else []
    cmd = [str(Path(sys.executable).parent / "mutmut"), "run", "--max-children", str(children),
           *names]
    t0 = time.monotonic()
    with open(d / "mutmut.log", "wb") as log:
        p = subprocess.Popen(cmd, cwd=d, stdout=log, stderr=subprocess.STDOUT,
                             env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
                             start_new_session=True)
        try:
            p.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # mutmut saves each result as it comes
            p.wait()
    info["seconds"] = info.get("seconds", 0) + round(time.monotonic() - t0)
    (d / "run.json").write_text(json.dumps(info), encoding="utf-8")


def results(name: str) -> dict[str, str]:
    """{mutant name: status} of a module's last run."""
    out = {}
    for meta in sorted((WORK / name / "mutants").rglob("*.py.meta")):
        doc = json.loads(meta.read_text(encoding="utf-8"))
        for key, code in doc.get("exit_code_by_key", {}).items():
            out[key] = STATUS.get(code, "suspicious")
    return out


def table(names) -> str:
    rows = ["| module | sample | tried | killed | timed out | survived | not run | kill rate "
            "| time | commit |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        r = results(name)
        info = WORK / name / "run.json"
        if not r or not info.exists():
            continue
        info = json.loads(info.read_text(encoding="utf-8"))
        sample = info["sample"]
        if sample > 1:
            r = {k: v for k, v in r.items() if int(k.rsplit("_", 1)[1]) % 10 % sample == 0}
        c = Counter(r.values())
        killed, hung = c["killed"] + c["segfault"], c["timeout"]
        surv = c["survived"] + c["no tests"] + c["suspicious"]
        tried = killed + hung + surv
        rate = f"{100 * (killed + hung) / tried:.1f}%" if tried else "-"
        t = f"{info['seconds'] / 60:.0f} min" if "seconds" in info else "running"
        rows.append(f"| {name} | 1 in {sample} | {tried} | {killed} | {hung} | {surv} | "
                    f"{c['not checked']} | {rate} | {t} | {info['commit']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", help=f"some of {', '.join(MODULES)} (default: all)")
    ap.add_argument("--sample", type=int, default=1, help="try every Nth mutant (1, 2, 5, 10)")
    ap.add_argument("--children", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--budget", type=float, default=None, help="minutes per module at most")
    ap.add_argument("--committed", action="store_true",
                    help="mutate the last commit's src and tests, not the working tree")
    ap.add_argument("--resume", action="store_true",
                    help="go on with a module's last run (after --budget cut it short)")
    ap.add_argument("--report", action="store_true", help="print the last run's table only")
    ap.add_argument("--survivors", metavar="MODULE", choices=list(MODULES))
    a = ap.parse_args(argv)
    names = a.modules or list(MODULES)
    if a.sample not in (1, 2, 5, 10):
        ap.error("--sample: use 1, 2, 5 or 10 (picked by the last digit of the mutant number)")
    if set(names) - set(MODULES):
        ap.error(f"modules: expected some of {', '.join(MODULES)}, got {' '.join(names)}")
    if a.survivors:
        for k, v in sorted(results(a.survivors).items()):
            if v in ("survived", "no tests"):
                print(k, v)
        return 0
    if not a.report:
        for name in names:
            budget = None if a.budget is None else a.budget * 60
            run(MODULES[name], a.sample, a.children, budget, a.committed, a.resume)
            print(table([name]).splitlines()[-1], flush=True)
    print(table(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
