"""How long the Nsight-like timeline of a long run takes to build, and whether it stays usable.

Builds a synthetic decode trace of ``--events`` events (default 1,000,000: host launches with
correlation ids, PDL overlap on the main stream, Q/K/V on three streams, copies, syncs, NVTX),
then times ``workbench.view.timeline.timeline`` (the figure build; target <= 3 s on the 2-core
CI machine) ``--repeat`` times. ``--html`` also writes the self-contained HTML and times it;
``--browser`` opens that HTML in Debian's chromium (Playwright) and times the first render, a
zoom into 1 % of the span and a hover that highlights an API call's kernel (the correlation
script): what "stays responsive" means here. Prints one JSON object; ``--check`` exits 1 when
the build misses the target.

    python benchmarks/timeline_scale.py                 # figure build only
    python benchmarks/timeline_scale.py --html --browser
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fixtures.synthetic import synthetic_events  # noqa: E402

from workbench.view.export import chromium_path, write_html  # noqa: E402
from workbench.view.timeline import timeline  # noqa: E402

TARGET_S = 3.0

BROWSER_JS_POINT = """() => {
  const gd = document.querySelector('.js-plotly-plot'), wb = gd.layout.meta.workbench;
  const fd = gd._fullData[wb.traces.kernel], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
  let k = 0;   // the first kernel inside the zoomed window
  while (3 * k < fd.x.length && fd.x[3 * k] < xa.range[0]) { k++; }
  return {x: box.left + xa.l2p((fd.x[3*k] + fd.x[3*k+1]) / 2), y: box.top + ya.l2p(fd.y[3*k])};
}"""


def _browser(html: Path, span_us: float) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    out: dict[str, float] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1600, "height": 900})
        t = time.perf_counter()
        page.goto(html.as_uri(), timeout=600_000)
        page.wait_for_function("document.querySelector('.js-plotly-plot')?.dataset.workbenchLinks === 'ready'",
                               timeout=600_000)
        out["browser_first_render_s"] = time.perf_counter() - t
        out["browser_zoom_s"] = page.evaluate(f"""async () => {{
            const gd = document.querySelector('.js-plotly-plot'), t = performance.now();
            await Plotly.relayout(gd, {{'xaxis.range': [{span_us * 0.5}, {span_us * 0.51}]}});
            return (performance.now() - t) / 1e3; }}""")
        at = page.evaluate(BROWSER_JS_POINT)
        t = time.perf_counter()
        page.mouse.move(at["x"], at["y"])
        page.wait_for_function("""() => { const gd = document.querySelector('.js-plotly-plot');
            return (gd.data[gd.layout.meta.workbench.highlight[0]].x || []).length > 0; }""", timeout=120_000)
        out["browser_first_hover_highlight_s"] = time.perf_counter() - t   # builds the corr index once
        page.mouse.move(at["x"], at["y"] + 400)
        page.mouse.move(at["x"], at["y"])
        t = time.perf_counter()
        page.wait_for_function("""() => { const gd = document.querySelector('.js-plotly-plot');
            return (gd.data[gd.layout.meta.workbench.highlight[0]].x || []).length > 0; }""", timeout=120_000)
        out["browser_hover_highlight_s"] = time.perf_counter() - t
        b.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--html", action="store_true", help="also write and time the self-contained HTML")
    ap.add_argument("--browser", action="store_true", help="also load the HTML in chromium (implies --html)")
    ap.add_argument("--check", action="store_true", help=f"exit 1 if the figure build exceeds {TARGET_S} s")
    args = ap.parse_args(argv)

    t = time.perf_counter()
    trace = synthetic_events(args.events)
    res: dict[str, object] = {"events": len(trace), "trace_build_s": round(time.perf_counter() - t, 3)}
    times = []
    fig = None
    for _ in range(args.repeat):
        t = time.perf_counter()
        fig = timeline(trace)
        times.append(time.perf_counter() - t)
    res.update(figure_build_s=[round(x, 3) for x in times], figure_build_median_s=round(statistics.median(times), 3),
               target_s=TARGET_S, webgl_traces=sum(1 for d in fig.data if d.type == "scattergl"),
               shapes=len(fig.layout.shapes), rows=len(fig.layout.meta["workbench"]["rows"]))
    if args.html or args.browser:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "timeline.html"
            t = time.perf_counter()
            write_html(fig, path)
            res.update(html_write_s=round(time.perf_counter() - t, 3), html_mb=round(path.stat().st_size / 2**20, 1))
            if args.browser:
                if chromium_path() is None:
                    res["browser"] = "skipped: no chromium"
                else:
                    span_us = trace.span_ns / 1e3
                    res.update({k: round(v, 3) for k, v in _browser(path, span_us).items()})
    res["meets_target"] = max(times) <= TARGET_S
    print(json.dumps(res))
    return 0 if res["meets_target"] or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
