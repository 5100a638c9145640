#!/usr/bin/env python3
"""Draws docs/img/month-in-two-zones.svg from `cellrate simulate`'s output.

A budget of 10 a calendar month in two time zones (#51): Asia/Tokyo and America/New_York,
the same traffic (one request every 3 hours) over the three days around the turn of
November 2023. Each panel shows the tokens left, looked at every 30 minutes (cost-0
checks), and each request as a dot: allowed (filled) or denied (hollow). Tokyo's December
starts at 2023-11-30T15:00Z, New York's 14 hours later at 2023-12-01T05:00Z.

Usage: scripts/zone-picture.py CELLRATE_BINARY OUT.svg
The test `calendar::the_zone_picture_is_drawn_from_simulate` runs it and compares the
result with the committed file, so the picture changes when the arithmetic does.
"""

import json
import subprocess
import sys

HOUR = 3600 * 10**9
# simulate's t0 is 2023-11-14T22:13:20Z; the picture starts at 2023-11-29T00:00Z.
START = (14 * 24 + 1) * HOUR + (46 * 60 + 40) * 10**9
SPAN_H = 72
LIMITS = [("tokyo", "tokyo=10/1mo@Asia/Tokyo", "10 a month in Asia/Tokyo", 39, "Dec 1 00:00 JST"),
          ("newyork", "newyork=10/1mo@America/New_York", "10 a month in America/New_York",
           53, "Dec 1 00:00 EST")]


def simulate(binary):
    """Runs the timeline; returns {label: ([(hour, left)], [(hour, allowed)])}."""
    lines, meaning = [], []
    for half in range(0, 2 * SPAN_H + 1):
        at = START + half * HOUR // 2
        for label, *_ in LIMITS:
            lines.append({"at_ns": at, "op": "check", "bucket": label, "cost": 0})
            meaning.append((label, "level", half / 2))
            if half % 6 == 0:
                lines.append({"at_ns": at, "op": "spend", "bucket": label})
                meaning.append((label, "request", half / 2))
    flags = [arg for _, flag, *_ in LIMITS for arg in ("--limit", flag)]
    out = subprocess.run([binary, "simulate", *flags],
                         input="".join(json.dumps(l) + "\n" for l in lines),
                         capture_output=True, text=True, check=True, timeout=60).stdout
    answers = [json.loads(l) for l in out.splitlines()]
    if len(answers) != len(lines):
        sys.exit(f"simulate answered {len(answers)} lines for {len(lines)}")
    series = {label: ([], []) for label, *_ in LIMITS}
    for (label, kind, hour), answer in zip(meaning, answers):
        if "error" in answer:
            sys.exit(f"simulate: {answer['error']}")
        if kind == "level":
            series[label][0].append((hour, answer["remaining"]))
        else:
            series[label][1].append((hour, answer["allowed"]))
    return series


def panel(top, title, levels, requests, reset_hour, reset_text):
    """One panel's SVG elements, its plot area 60..700 x top+40..top+160."""
    left, width, height = 60, 640, 120
    base = top + 40 + height
    x = lambda hour: left + hour * width / SPAN_H
    y = lambda tokens: base - tokens * height / 10
    parts = [f'<text x="{left}" y="{top + 18}" class="title">{title}</text>',
             f'<line x1="{left}" y1="{base}" x2="{left + width}" y2="{base}" class="axis"/>',
             f'<line x1="{left}" y1="{base}" x2="{left}" y2="{top + 40}" class="axis"/>']
    for tokens in (0, 5, 10):
        parts.append(f'<text x="{left - 8}" y="{y(tokens) + 4}" class="tick" '
                     f'text-anchor="end">{tokens}</text>')
    for hour, text in ((0, "Nov 29 00:00Z"), (24, "Nov 30 00:00Z"), (48, "Dec 1 00:00Z"),
                       (72, "Dec 2 00:00Z")):
        parts.append(f'<line x1="{x(hour):.1f}" y1="{base}" x2="{x(hour):.1f}" '
                     f'y2="{top + 40}" class="grid"/>')
        parts.append(f'<text x="{x(hour):.1f}" y="{base + 16}" class="tick" '
                     f'text-anchor="middle">{text}</text>')
    parts.append(f'<line x1="{x(reset_hour):.1f}" y1="{base}" x2="{x(reset_hour):.1f}" '
                 f'y2="{top + 40}" class="reset"/>')
    parts.append(f'<text x="{x(reset_hour) + 4:.1f}" y="{top + 52}" class="tick">'
                 f'{reset_text}</text>')
    steps, last = [], None
    for hour, tokens in levels:
        if last is not None:
            steps.append((hour, last))
        steps.append((hour, tokens))
        last = tokens
    points = " ".join(f"{x(h):.1f},{y(max(t, 0)):.1f}" for h, t in steps)
    parts.append(f'<polyline points="{points}" class="level"/>')
    for hour, allowed in requests:
        style = "allowed" if allowed else "denied"
        parts.append(f'<circle cx="{x(hour):.1f}" cy="{top + 30}" r="3" class="{style}"/>')
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
             '.grid{stroke:#ccc;stroke-dasharray:3 3}.reset{stroke:#bf8700;stroke-width:1.5}'
             '.level{fill:none;stroke:#1f6feb;stroke-width:1.5}.allowed{fill:#2da44e}'
             '.denied{fill:none;stroke:#cf222e}</style>',
             '<rect width="720" height="450" fill="white"/>']
    for index, (label, _, title, reset_hour, reset_text) in enumerate(LIMITS):
        levels, requests = series[label]
        parts += panel(10 + index * 205, title, levels, requests, reset_hour, reset_text)
    parts.append('<text x="60" y="422" class="tick">One request every 3 hours. Line: tokens '
                 'left. Dots: requests, filled allowed, hollow denied.</text>')
    parts.append('<text x="60" y="440" class="tick">Drawn from cellrate simulate by '
                 'scripts/zone-picture.py.</text>')
    parts.append("</svg>")
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        out.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
