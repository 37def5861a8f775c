"""HTML page load benchmark: how fast the report page of a big model becomes interactive.

    .venv/bin/python bench/html_load.py [--target hf:llama-2-7b] [--seq-len 2048] [--repeat 5]

Runs `analyze TARGET --seq-len N --quiet` once (default files: report.html with the collapsed
graph inlined), then loads report.html from disk in headless Chromium (Debian's chromium and
chromedriver via Selenium; tests/reports/browser.py) `--repeat` times, each in a fresh tab
state (about:blank between loads), and reports medians of:

- ready: `performance.now()` when the page's script finished building the module tree, the
  virtual ops table, the sortable tables and the graph handlers (i.e. the page is
  interactive), measured from navigation start;
- load: the `load` event end, from navigation start;
- wall: `driver.get` plus waiting for ready, as a user would feel it (includes driver overhead);
- sort: one click on the ops table's FLOPs header until the re-rendered rows are in the DOM.

Target (issue 7): ready under 3 s for hf:llama-2-7b at seq 2048.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.reports.browser import chromium, console_errors, wait_ready  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="hf:llama-2-7b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        subprocess.run([str(ROOT / ".venv/bin/analyze"), args.target, "--seq-len",
                        str(args.seq_len), "--out", folder, "--quiet"], check=True)
        analyze_s = time.perf_counter() - started
        page = Path(folder) / "report.html"
        runs = measure(page, args.repeat)
    print(f"analyze + write pages: {analyze_s:.1f} s")
    for key in ("ready_ms", "load_ms", "wall_ms", "sort_ms"):
        values = [r[key] for r in runs]
        print(f"{key:9s} median {statistics.median(values):7.0f}  "
              f"min {min(values):7.0f}  max {max(values):7.0f}")
    print(f"html {runs[0]['size_mib']:.2f} MiB, {runs[0]['graph_nodes']:.0f} graph nodes, "
          f"{runs[0]['ops']:.0f} ops; {platform.machine()}, {len(runs)} loads")


def measure(page: Path, repeat: int) -> list[dict[str, float]]:
    runs = []
    with chromium() as driver:
        for _ in range(repeat):
            driver.get("about:blank")
            driver.get_log("browser")
            started = time.perf_counter()
            driver.get(page.as_uri())
            ready_ms = wait_ready(driver, timeout_s=60)
            wall_ms = 1000 * (time.perf_counter() - started)
            errors = console_errors(driver)
            if errors:
                raise SystemExit(f"console errors: {errors}")
            load_ms = driver.execute_script(
                "var t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd")
            sort_ms = driver.execute_script("""
                var t0 = performance.now();
                document.querySelector("#ops-table th[data-key='flops']").click();
                document.querySelector('#ops-table tbody tr[data-node]').offsetHeight;
                return performance.now() - t0;""")
            runs.append({"ready_ms": ready_ms, "load_ms": load_ms, "wall_ms": wall_ms,
                         "sort_ms": sort_ms, "size_mib": page.stat().st_size / 2**20,
                         "graph_nodes": driver.execute_script(
                             "return document.querySelectorAll('#graph-view g.node').length"),
                         "ops": driver.execute_script(
                             "return JSON.parse(document.getElementById('fxlens-data')"
                             ".textContent).report.nodes.length")})
    return runs


if __name__ == "__main__":
    main()
