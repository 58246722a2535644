#!/usr/bin/env python3
"""Render a picture of the Grafana dashboard (dashboards/fairlock.json) from
real data, for the README, without Grafana or Prometheus.

By default it runs the metrics_swarm example, scrapes its /metrics endpoint
every second until the example exits, saves the scrapes, and plots the
dashboard's six panels with the same queries, evaluated here the way
Prometheus would (rate over a window, histogram_quantile with linear
interpolation inside a bucket):

    pip install matplotlib
    python3 dashboards/render_preview.py                  # 90 s swarm run
    python3 dashboards/render_preview.py --run-secs 60
    python3 dashboards/render_preview.py --bin target/release/examples/metrics_swarm
    python3 dashboards/render_preview.py --data target/fairlock-preview-data.json   # re-render only
    python3 dashboards/render_preview.py --url http://127.0.0.1:9464/metrics --seconds 60

The saved scrapes go to target/fairlock-preview-data.json (not committed).
The picture goes to dashboards/fairlock-dashboard.png.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_DATA = os.path.join(REPO, "target", "fairlock-preview-data.json")
DEFAULT_PNG = os.path.join(HERE, "fairlock-dashboard.png")

# The rate window, as Grafana's $__rate_interval would pick for a 1 s scrape.
WINDOW_SECS = 5.0

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)$')


# --------------------------------------------------------------------------
# Scraping
# --------------------------------------------------------------------------

def parse_metrics(text):
    """Prometheus text format -> {(name, ((label, value), ...)): float}."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith("fairlock_"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(3) or "", m.group(4)
        pairs = []
        for pair in filter(None, labels.split(",")):
            key, _, val = pair.partition("=")
            pairs.append((key.strip(), val.strip().strip('"')))
        out[(name, tuple(sorted(pairs)))] = float(value)
    return out


def scrape_once(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse_metrics(response.read().decode("utf-8"))


def series_key(key):
    name, labels = key
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def scrape_loop(url, until, interval=1.0):
    """Scrapes until `until()` is true; returns [(t, {series: value})]."""
    samples = []
    t0 = time.monotonic()
    next_at = t0
    while not until():
        try:
            values = scrape_once(url)
            samples.append((time.monotonic() - t0, {series_key(k): v for k, v in values.items()}))
        except OSError:
            pass  # not up yet, or shutting down
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    return samples


def run_swarm(run_secs, addr, binary=None):
    """Runs the metrics_swarm example and scrapes it until it exits."""
    env = dict(os.environ, RUN_SECS=str(run_secs), METRICS_ADDR=addr)
    cmd = [binary] if binary else [
        "cargo", "run", "--release", "-q", "-p", "fairlock-examples", "--example", "metrics_swarm"]
    print("running:", " ".join(cmd), f"(RUN_SECS={run_secs})", file=sys.stderr)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    started = threading.Event()
    local_redis = []
    swarm_started_at = []

    def read_output():
        for line in proc.stdout:
            sys.stderr.write("  swarm| " + line)
            if line.startswith("timeline:"):
                local_redis.append("Redis stalls" in line)
                swarm_started_at.append(time.monotonic())
                started.set()
        started.set()

    reader = threading.Thread(target=read_output, daemon=True)
    reader.start()
    started.wait()
    if proc.poll() is not None and not swarm_started_at:
        sys.exit("the swarm example exited before starting")
    begin = time.monotonic()
    samples = scrape_loop(f"http://{addr}/metrics", lambda: proc.poll() is not None)
    reader.join(timeout=5)
    if proc.returncode != 0:
        sys.exit(f"the swarm example failed with exit code {proc.returncode}")
    # Time 0 of the plots is the swarm's start; what follows its end is the
    # shutdown (the last holds finishing), not the workload.
    offset = begin - swarm_started_at[0]
    samples = [(t + offset, values) for t, values in samples]
    samples = [(t, values) for t, values in samples if t <= run_secs]
    events = [("flash sale", 0.4 * run_secs, 0.6 * run_secs)]
    if local_redis and local_redis[0]:
        events.append(("Redis stall", 0.75 * run_secs, 0.75 * run_secs + 2.5))
    return {
        "source": f"metrics_swarm example, RUN_SECS={run_secs}",
        "events": events,
        "samples": samples,
    }


# --------------------------------------------------------------------------
# PromQL, the parts the dashboard uses
# --------------------------------------------------------------------------

def parse_key(key):
    name, _, rest = key.partition("{")
    labels = dict(re.findall(r'([a-zA-Z_]+)="([^"]*)"', rest))
    return name, labels


class Series:
    """All scrapes, indexed by metric name."""

    def __init__(self, samples):
        self.times = [t for t, _ in samples]
        self.by_name = {}
        for i, (_, values) in enumerate(samples):
            for key, value in values.items():
                name, labels = parse_key(key)
                entry = self.by_name.setdefault(name, {})
                frozen = tuple(sorted(labels.items()))
                entry.setdefault(frozen, [None] * len(samples))[i] = value

    def select(self, name, **match):
        """{labels: [value or None per scrape]} for series matching every
        label given (a value may be a set of allowed values)."""
        out = {}
        for labels, values in self.by_name.get(name, {}).items():
            d = dict(labels)
            if all((d.get(k) in v) if isinstance(v, set) else d.get(k) == v for k, v in match.items()):
                out[labels] = values
        return out

    def window_start(self, i, window=WINDOW_SECS):
        """The first scrape inside the window ending at scrape i."""
        j = i
        while j > 0 and self.times[i] - self.times[j - 1] <= window + 0.5:
            j -= 1
        return j

    def increase(self, values, i):
        """Counter increase over the window ending at scrape i. A counter
        not yet exported counts as 0 (it appears on its first increment)."""
        j = self.window_start(i)
        if j == i:
            return None
        return max(0.0, (values[i] or 0.0) - (values[j] or 0.0))

    def rate(self, values, i):
        """Per-second increase over the window ending at scrape i."""
        j = self.window_start(i)
        increase = self.increase(values, i)
        return None if increase is None else increase / (self.times[i] - self.times[j])


def sum_by(series, selected, key_label):
    """sum by (key_label) (rate(...)) -> {label value: [rate per scrape]}."""
    out = {}
    for labels, values in selected.items():
        group = dict(labels).get(key_label, "")
        rates = [series.rate(values, i) for i in range(len(series.times))]
        acc = out.setdefault(group, [None] * len(rates))
        for i, r in enumerate(rates):
            if r is not None:
                acc[i] = (acc[i] or 0.0) + r
    return out


def histogram_quantile(q, buckets):
    """buckets: [(upper bound, cumulative rate)], as Prometheus computes it."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][0] != math.inf:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == math.inf:
                return lower  # the highest finite bound
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return None


def quantile_series(series, name, q, **match):
    selected = series.select(name + "_bucket", **match)
    by_le = sum_by(series, selected, "le")
    out = []
    for i in range(len(series.times)):
        buckets = [(math.inf if le == "+Inf" else float(le), rates[i])
                   for le, rates in by_le.items() if rates[i] is not None]
        out.append(histogram_quantile(q, buckets))
    return out


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------

GRAFANA = {
    "bg": "#111217", "panel": "#181b1f", "border": "#2c3235", "text": "#ccccdc",
    "dim": "#8e8e9e", "grid": "#2c3235",
    "green": "#73bf69", "blue": "#5794f2", "orange": "#ff9830", "purple": "#b877d9",
    "red": "#f2495c", "yellow": "#fade2a",
}
OUTCOME_COLORS = {"acquired": "green", "busy": "blue", "timeout": "orange",
                  "cancelled": "purple", "error": "red"}


def render(data, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    series = Series(data["samples"])
    t = series.times
    g = GRAFANA

    plt.rcParams.update({
        "font.family": "DejaVu Sans", "font.size": 9,
        "axes.facecolor": g["panel"], "figure.facecolor": g["bg"],
        "axes.edgecolor": g["border"], "axes.labelcolor": g["dim"],
        "xtick.color": g["dim"], "ytick.color": g["dim"], "text.color": g["text"],
        "axes.grid": True, "grid.color": g["grid"], "grid.linewidth": 0.6,
        "legend.frameon": False, "legend.fontsize": 8,
    })
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.4))
    fig.subplots_adjust(left=0.045, right=0.99, top=0.885, bottom=0.07, wspace=0.17, hspace=0.36)
    fig.suptitle("fairlock", x=0.045, y=0.975, ha="left", fontsize=15, fontweight="bold")
    subtitle = (f"Preview of dashboards/fairlock.json, rendered from real scrapes ({data['source']}, "
                f"1 s scrape, {WINDOW_SECS:.0f} s rate window).")
    if data["events"]:
        subtitle += " Shaded: " + ", ".join(
            f"{name} ({start:.0f}-{end:.0f} s)" for name, start, end in data["events"])
    fig.text(0.045, 0.925, subtitle, ha="left", color=g["dim"], fontsize=9)

    xlabel = ("seconds since scraping started" if data["source"].startswith("http")
              else "seconds since the swarm started")

    def seconds(value, _pos):
        if value == 0:
            return "0"
        if value < 1e-3:
            return f"{value * 1e6:.0f} µs"
        if value < 1:
            return f"{value * 1e3:.0f} ms"
        return f"{value:.1f} s"

    def style(ax, title, unit=None):
        ax.set_title(title, loc="left", fontsize=10.5, color=g["text"], pad=6)
        ax.set_xlim(0, t[-1] if t else 1)
        ax.set_xlabel(xlabel)
        # Headroom for the legend above the highest point.
        top = max([line.get_ydata().max() for line in ax.lines if len(line.get_ydata())]
                  + [patch.get_height() for patch in ax.patches] + [0.0])
        ax.set_ylim(0, top * 1.3 if top > 0 else 1.0)
        if unit == "s":
            ax.yaxis.set_major_formatter(FuncFormatter(seconds))
        for name, start, end in data["events"]:
            color = g["yellow"] if name == "flash sale" else g["red"]
            ax.axvspan(start, end, color=color, alpha=0.08, lw=0)
        for spine in ax.spines.values():
            spine.set_color(g["border"])

    def plot(ax, values, label, color, **kw):
        xs = [x for x, v in zip(t, values) if v is not None]
        ys = [v for v in values if v is not None]
        if ys:
            ax.plot(xs, ys, label=label, color=g[color], lw=1.6, **kw)
            ax.fill_between(xs, ys, color=g[color], alpha=0.08, lw=0)

    # 1. Acquisitions/s by outcome.
    ax = axes[0][0]
    rates = sum_by(series, series.select("fairlock_acquire_total"), "outcome")
    for outcome in ["acquired", "busy", "timeout", "cancelled", "error"]:
        if outcome in rates:
            plot(ax, rates[outcome], outcome, OUTCOME_COLORS[outcome])
    style(ax, "Acquisitions/s by outcome")
    ax.legend(loc="upper left", ncol=5)

    # 2. Wait p50 / p99 of acquired calls.
    ax = axes[0][1]
    plot(ax, quantile_series(series, "fairlock_wait_seconds", 0.5, outcome="acquired"), "p50", "blue")
    plot(ax, quantile_series(series, "fairlock_wait_seconds", 0.99, outcome="acquired"), "p99", "orange")
    style(ax, "Wait time p50 / p99 (acquired)", "s")
    ax.legend(loc="upper left", ncol=2)

    # 3. Hold p99 (and p50).
    ax = axes[0][2]
    plot(ax, quantile_series(series, "fairlock_hold_seconds", 0.99), "p99", "orange")
    plot(ax, quantile_series(series, "fairlock_hold_seconds", 0.5), "p50", "blue")
    style(ax, "Hold time p99", "s")
    ax.legend(loc="upper left", ncol=2)

    # 4. Queue depth: max_over_time of the gauge over the window.
    ax = axes[1][0]
    gauge = next(iter(series.select("fairlock_queue_depth").values()), [None] * len(t))
    depth = []
    for i in range(len(t)):
        window = [gauge[j] for j in range(len(t))
                  if t[i] - WINDOW_SECS <= t[j] <= t[i] and gauge[j] is not None]
        depth.append(max(window) if window else None)
    plot(ax, depth, "swarm process", "blue")
    style(ax, "Queue depth")
    ax.legend(loc="upper left")

    # 5. Leases lost: increase over the window, as bars.
    ax = axes[1][1]
    lost = next(iter(series.select("fairlock_lease_lost_total").values()), [None] * len(t))
    increases = [series.increase(lost, i) or 0.0 for i in range(len(t))]
    ax.bar(t, increases, width=0.8, color=g["red"], alpha=0.85, label="leases lost (increase)")
    style(ax, "Leases lost")
    ax.legend(loc="upper left")

    # 6. Renewals failing, by result.
    ax = axes[1][2]
    failing = sum_by(series, series.select("fairlock_lease_renewals_total",
                                           result={"error", "lost"}), "result")
    for result, color in [("lost", "red"), ("error", "orange")]:
        plot(ax, failing.get(result, [0.0] * len(t)), result, color)
    style(ax, "Lease renewals failing (per second)")
    ax.legend(loc="upper left", ncol=2)

    fig.savefig(out_png, dpi=100, facecolor=g["bg"])
    print(f"wrote {out_png}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-secs", type=int, default=90, help="how long the swarm runs (default 90)")
    parser.add_argument("--addr", default="127.0.0.1:9464", help="METRICS_ADDR for the swarm")
    parser.add_argument("--bin", help="a built metrics_swarm binary to run instead of `cargo run`")
    parser.add_argument("--data", help="re-render from saved scrapes instead of running the swarm")
    parser.add_argument("--url", help="scrape this /metrics URL instead of running the swarm")
    parser.add_argument("--seconds", type=int, default=60, help="with --url: how long to scrape")
    parser.add_argument("--save", default=DEFAULT_DATA, help="where to save the scrapes")
    parser.add_argument("--out", default=DEFAULT_PNG, help="the PNG to write")
    args = parser.parse_args()

    if args.data:
        with open(args.data) as f:
            data = json.load(f)
    else:
        if args.url:
            deadline = time.monotonic() + args.seconds
            samples = scrape_loop(args.url, lambda: time.monotonic() >= deadline)
            data = {"source": args.url, "events": [], "samples": samples}
        else:
            data = run_swarm(args.run_secs, args.addr, args.bin)
        if not data["samples"]:
            sys.exit("no scrape succeeded")
        os.makedirs(os.path.dirname(args.save), exist_ok=True)
        with open(args.save, "w") as f:
            json.dump(data, f)
        print(f"saved {len(data['samples'])} scrapes to {args.save}", file=sys.stderr)
    render(data, args.out)


if __name__ == "__main__":
    main()
