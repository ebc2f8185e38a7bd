"""The dashboards' layouts as SVG pictures, drawn from their definitions.

    python3 tests/infra/dashboard_picture.py            # writes docs/dashboard-aws.svg
    python3 tests/infra/dashboard_picture.py --check    # fails if the picture is stale

Each widget is drawn where the definition puts it on CloudWatch's 24-column grid,
with its title and the metrics it reads, so the picture cannot drift from the
dashboard: `make infra-test` checks that the committed picture is this drawing.

The Cloud Monitoring dashboard of the GCP module is rendered by Terraform, so it is
drawn (`draw_gcp`, on its 12-column grid) from the planned dashboard_json by
tests/infra/test_tofu_plan_gcp.py, which checks docs/dashboard-gcp.svg and rewrites it
when NODE_FENCER_WRITE_PICTURES=1.
"""

from __future__ import annotations

import json
import re
import sys
from html import escape
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra" / "modules" / "node-fencer" / "templates" / "dashboard.json.tftpl"
PICTURE = REPO / "docs" / "dashboard-aws.svg"

COLUMN, ROW, MARGIN = 40, 26, 4


def reads(properties: dict) -> list[str]:
    """What a widget shows, one line per metric or query."""
    lines = []
    for row in properties["metrics"]:
        if isinstance(row[0], dict):
            query = row[0]["expression"]
            metric = re.search(r"\((\w+)\) FROM", query)
            by = re.search(r"GROUP BY ([\w, ]+)$", query)
            where = re.search(r"WHERE (\w+ = '\w+')", query)
            text = metric.group(1) if metric else query
            if where:
                text += f" where {where.group(1)}"
            if by:
                text += f" by {by.group(1)}"
            lines.append(text)
        else:
            options = next((c for c in row if isinstance(c, dict)), {})
            lines.append(f"{row[1]} {options.get('stat', '')}".strip())
    return lines


def draw(body: dict) -> str:
    widgets = body["widgets"]
    width = 24 * COLUMN
    height = max(w["y"] + w["height"] for w in widgets) * ROW
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#f4f5f7"/>',
    ]
    for w in widgets:
        x, y = w["x"] * COLUMN + MARGIN, w["y"] * ROW + MARGIN
        wd, ht = w["width"] * COLUMN - 2 * MARGIN, w["height"] * ROW - 2 * MARGIN
        props = w["properties"]
        out.append(f'<rect x="{x}" y="{y}" width="{wd}" height="{ht}" rx="4" fill="#fff" stroke="#aab"/>')
        out.append(f'<text x="{x + 8}" y="{y + 20}" font-size="13" font-weight="bold">{escape(props["title"])}</text>')
        for i, line in enumerate(props["lines"] if "lines" in props else reads(props)):
            out.append(f'<text x="{x + 8}" y="{y + 40 + 15 * i}" font-size="11" fill="#445">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


GCP_PICTURE = REPO / "docs" / "dashboard-gcp.svg"


def gcp_reads(widget: dict) -> list[str]:
    """What a Cloud Monitoring chart shows, one line per data set."""
    lines = []
    for data in widget["xyChart"]["dataSets"]:
        query = data["timeSeriesQuery"]["timeSeriesFilter"]
        metric = re.search(r'logging\.googleapis\.com/user/[^/"]+/(\w+)"', query["filter"])
        text = metric.group(1) if metric else query["filter"]
        where = re.search(r'metric\.label\.(\w+)="(\w+)"', query["filter"])
        if where:
            text += f" where {where.group(1)} = '{where.group(2)}'"
        by = [f.removeprefix("metric.label.") for f in query["aggregation"]["groupByFields"]]
        reducer = query["aggregation"].get("crossSeriesReducer", "")
        if reducer.startswith("REDUCE_PERCENTILE_"):
            text += f" p{reducer.removeprefix('REDUCE_PERCENTILE_')}"
        if by:
            text += f" by {', '.join(by)}"
        lines.append(text)
    return lines


def draw_gcp(dashboard: dict) -> str:
    """The Cloud Monitoring dashboard, two of CloudWatch's columns to one of its 12."""
    widgets = [
        {"x": t["xPos"] * 2, "y": t["yPos"] * 2, "width": t["width"] * 2, "height": t["height"] * 2,
         "properties": {"title": t["widget"]["title"], "lines": gcp_reads(t["widget"])}}
        for t in dashboard["mosaicLayout"]["tiles"]
    ]
    return draw({"widgets": widgets})


def main(argv: list[str]) -> int:
    picture = draw(json.loads(TEMPLATE.read_text(encoding="utf-8")))
    if argv[1:] == ["--check"]:
        if PICTURE.read_text(encoding="utf-8") != picture:
            print(f"{PICTURE.relative_to(REPO)} is stale: run python3 {Path(__file__).relative_to(REPO)}", file=sys.stderr)
            return 1
        return 0
    PICTURE.write_text(picture, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
