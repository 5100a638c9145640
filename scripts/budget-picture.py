#!/usr/bin/env python3
"""Draws docs/img/gcra-vs-calendar.svg from `cellrate simulate`'s output.

The same traffic (one request every 2 minutes for 3 hours) goes through a GCRA limit of 10
per hour (burst 10) and a calendar limit of 10 per UTC hour. Each panel shows the tokens
left, looked at every 30 s (cost-0 checks), and each request as a dot: allowed (filled) or
denied (hollow). The simulated clock starts at 22:13:20 UTC, so the calendar hour ends
46 min 40 s in, wherever the traffic started.

Usage: scripts/budget-picture.py CELLRATE_BINARY OUT.svg
The test `examples::the_budget_picture_is_drawn_from_simulate` runs it and compares the
result with the committed file, so the picture changes when the arithmetic does.
"""

import json
import subprocess
import sys

MINUTE = 60 * 10**9
SPAN_MIN = 180
LIMITS = [("gcra", "gcra=10/10/1h", "GCRA: 10 per hour, refilled continuously (burst 10)"),
          ("calendar", "calendar=10/1h", "Calendar window: 10 per UTC hour, all back on the hour")]


def simulate(binary):
    """Runs the timeline; returns {label: ([(minute, left)], [(minute, allowed)])}."""
    lines, meaning = [], []
    for half in range(0, 2 * SPAN_MIN + 1):
        at = half * MINUTE // 2
        for label, _, _ in LIMITS:
            lines.append({"at_ns": at, "op": "check", "bucket": label, "cost": 0})
            meaning.append((label, "level", half / 2))
            if half % 4 == 0:
                lines.append({"at_ns": at, "op": "spend", "bucket": label})
                meaning.append((label, "request", half / 2))
    flags = [arg for _, flag, _ in LIMITS for arg in ("--limit", flag)]
    out = subprocess.run([binary, "simulate", *flags],
                         input="".join(json.dumps(l) + "\n" for l in lines),
                         capture_output=True, text=True, check=True, timeout=60).stdout
    answers = [json.loads(l) for l in out.splitlines()]
    if len(answers) != len(lines):
        sys.exit(f"simulate answered {len(answers)} lines for {len(lines)}")
    series = {label: ([], []) for label, _, _ in LIMITS}
    for (label, kind, minute), answer in zip(meaning, answers):
        if "error" in answer:
            sys.exit(f"simulate: {answer['error']}")
        if kind == "level":
            series[label][0].append((minute, answer["remaining"]))
        else:
            series[label][1].append((minute, answer["allowed"]))
    return series


def panel(top, title, levels, requests):
    """One panel's SVG elements, its plot area 60..700 x top+40..top+160."""
    left, width, height = 60, 640, 120
    base = top + 40 + height
    x = lambda minute: left + minute * width / SPAN_MIN
    y = lambda tokens: base - tokens * height / 10
    parts = [f'<text x="{left}" y="{top + 18}" class="title">{title}</text>',
             f'<line x1="{left}" y1="{base}" x2="{left + width}" y2="{base}" class="axis"/>',
             f'<line x1="{left}" y1="{base}" x2="{left}" y2="{top + 40}" class="axis"/>']
    for tokens in (0, 5, 10):
        parts.append(f'<text x="{left - 8}" y="{y(tokens) + 4}" class="tick" '
                     f'text-anchor="end">{tokens}</text>')
    # Clock labels: the simulated start is 22:13:20 UTC; mark each full hour.
    for minute, text in ((0, "22:13"), (46 + 2 / 3, "23:00"), (106 + 2 / 3, "00:00"),
                         (166 + 2 / 3, "01:00")):
        parts.append(f'<line x1="{x(minute):.1f}" y1="{base}" x2="{x(minute):.1f}" '
                     f'y2="{top + 40}" class="grid"/>')
        parts.append(f'<text x="{x(minute):.1f}" y="{base + 16}" class="tick" '
                     f'text-anchor="middle">{text}</text>')
    # A step line: the level holds until the next look.
    steps, last = [], None
    for minute, tokens in levels:
        if last is not None:
            steps.append((minute, last))
        steps.append((minute, tokens))
        last = tokens
    points = " ".join(f"{x(m):.1f},{y(max(t, 0)):.1f}" for m, t in steps)
    parts.append(f'<polyline points="{points}" class="level"/>')
    for minute, allowed in requests:
        style = "allowed" if allowed else "denied"
        parts.append(f'<circle cx="{x(minute):.1f}" cy="{top + 30}" r="3" '
                     f'class="{style}"/>')
    allowed = sum(1 for _, a in requests if a)
    parts.append(f'<text x="{left + width}" y="{top + 18}" class="tick" text-anchor="end">'
                 f'{allowed} of {len(requests)} requests allowed</text>')
    return parts


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    series = simulate(sys.argv[1])
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="720" height="450" '
             'viewBox="0 0 720 450" font-family="sans-serif" font-size="12">',
             '<style>.title{font-weight:bold}.tick{fill:#444}.axis{stroke:#444}'
             '.grid{stroke:#ccc;stroke-dasharray:3 3}.level{fill:none;stroke:#1f6feb;'
             'stroke-width:1.5}.allowed{fill:#2da44e}.denied{fill:none;stroke:#cf222e}</style>',
             '<rect width="720" height="450" fill="white"/>']
    for index, (label, _, title) in enumerate(LIMITS):
        levels, requests = series[label]
        parts += panel(10 + index * 205, title, levels, requests)
    parts.append('<text x="60" y="422" class="tick">One request every 2 minutes. Line: tokens '
                 'left. Dots: requests, filled allowed, hollow denied.</text>')
    parts.append('<text x="60" y="440" class="tick">Drawn from cellrate simulate by '
                 'scripts/budget-picture.py.</text>')
    parts.append("</svg>")
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        out.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
