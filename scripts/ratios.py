#!/usr/bin/env python3
"""Min-max ratios over rounds, for the benchmark scripts.

    ratios.py RESULTS NUMERATOR DENOMINATOR SCENARIO...

RESULTS holds lines `ROUND SCENARIO TARGET key=value ...` (loadgen's output after the first
three fields). For each scenario, prints NUMERATOR / DENOMINATOR of rps, p50_us, p99_us and
cpu_us_per_req, min - max over the rounds that have both, and the median in brackets.
"""
import sys


def main():
    path, numerator, denominator, *scenarios = sys.argv[1:]
    rows = {}
    for line in open(path):
        # A run's line, and loadgen's second line (p999_us=.., codes=..), kept after it.
        first, *rest = line.split(' ', 3)
        if first.isdigit() and len(rest) == 3:
            rnd, scenario, target = first, rest[0], rest[1]
            fields = rest[2]
        else:
            fields = line
        values = rows.setdefault((scenario, rnd), {}).setdefault(target, {})
        for kv in fields.split():
            k, _, v = kv.partition('=')
            try:
                values[k] = float(v)
            except ValueError:
                pass  # not a number (codes=0:N,14:M)
    for scenario in scenarios:
        parts = []
        for key in ('rps', 'p50_us', 'p99_us', 'cpu_us_per_req'):
            values = [t[numerator][key] / t[denominator][key]
                      for (s, _), t in rows.items()
                      if s == scenario and numerator in t and denominator in t
                      and t[denominator][key] > 0]
            if values:
                median = sorted(values)[len(values) // 2] if len(values) % 2 else \
                    sum(sorted(values)[len(values) // 2 - 1:len(values) // 2 + 1]) / 2
                parts.append(f"{key} {min(values):.2f}-{max(values):.2f} [{median:.2f}]")
        print(f"  {scenario:9s} " + "  ".join(parts))


main()
