// A run's report: the tables and flags `hemra report` prints (built by the report module on the
// server) and a chart of each harness's mean reward with its 95% interval.
import { add, clear, h, plural, svg } from "./dom.js";

export function drawReport(box, data) {
  clear(box);
  for (const grid of data.matrix || []) add(box, drawMatrix(grid));
  for (const dataset of data.tables) {
    add(box, [
      h("h3", {}, dataset.title),
      h("div", { class: "scroll" }, h("table", { class: "report" },
        h("thead", {}, h("tr", {}, dataset.headers.map((name) => h("th", {}, name)))),
        h("tbody", {}, dataset.rows.map((row) => h("tr", {}, row.map((cell) => h("td", {}, cell))))))),
      dataset.flags.length
        ? h("ul", { class: "flags" }, dataset.flags.map((f) => h("li", {}, (f.harness ? `${f.harness}: ` : "") + f.message)))
        : h("p", { class: "muted small" }, "No flags: nothing found that makes this comparison unfair."),
      chart(dataset.chart),
      dataset.variance && dataset.variance.length
        ? h("pre", { class: "variance" }, dataset.variance.join("\n")) : null,
    ]);
  }
}

// A matrix run's grid: harness rows, model columns, each cell's mean reward with its 95%
// interval, coloured by value (red 0 to green 1), linking to the cell's trials in the grid.
function drawMatrix(grid) {
  const cell = (harness, model) => grid.cells.find((c) => c.harness === harness && c.model === model);
  const link = (harness, model) => `?${new URLSearchParams({ harness, text: `${harness}@${model}-` })}#grid`;
  const body = (harness, model) => {
    const found = cell(harness, model);
    if (!found) return h("td", { class: "muted" }, "-");
    const shown = found.mean === null ? "no scored trial"
      : found.low === found.high ? found.mean.toFixed(3)  // as `hemra report` prints it
        : `${found.mean.toFixed(3)} [${found.low.toFixed(3)}, ${found.high.toFixed(3)}]`;
    const td = h("td", { class: "matrix-cell", "data-mean": found.mean === null ? "" : found.mean },
      h("a", { href: link(harness, model), title: `${harness}@${model}: ${plural(found.trials, "trial")}` }, shown));
    // through the CSSOM: the viewer's content security policy allows no style attributes
    if (found.mean !== null) td.style.backgroundColor = `hsl(${Math.round(120 * found.mean)}, 70%, 85%)`;
    return td;
  };
  return [
    h("h3", {}, `${grid.dataset}: mean reward by harness and model`),
    h("div", { class: "scroll" }, h("table", { class: "report matrix" },
      h("thead", {}, h("tr", {}, [h("th", {}, "harness"), grid.models.map((m) => h("th", {}, m))])),
      h("tbody", {}, grid.harnesses.map((harness) => h("tr", {},
        [h("th", {}, harness), grid.models.map((model) => body(harness, model))]))))),
  ];
}

// The geometry is `formats.chart`'s, the one the HTML report draws; the baseline's mean is marked.
function chart(geometry) {
  const baseline = geometry.bars.find((bar) => bar.has_value && bar.label.endsWith(" (baseline)"));
  return svg("svg", {
    class: "chart", role: "img", width: geometry.width, height: geometry.height,
    "aria-label": "mean reward per harness with its 95% confidence interval",
  },
  geometry.ticks.map((tick) => [
    svg("line", { class: "axis", x1: tick.x, x2: tick.x, y1: 12, y2: geometry.height - 12, "stroke-dasharray": "2,3" }),
    svg("text", { x: tick.x, y: 10, "text-anchor": "middle" }, tick.label),
  ]),
  baseline ? svg("line", { class: "baseline", x1: baseline.x, x2: baseline.x, y1: 14, y2: geometry.height - 12 }) : null,
  geometry.bars.map((bar) => [
    svg("text", { x: geometry.left - 8, y: bar.y + 4, "text-anchor": "end" }, bar.label),
    bar.has_value ? [
      svg("line", { class: "ci", x1: bar.x_low, x2: bar.x_high, y1: bar.y, y2: bar.y }),
      svg("circle", { class: "dot", cx: bar.x, cy: bar.y, r: 5 }, svg("title", {}, bar.text)),
    ] : svg("text", { x: geometry.left + 4, y: bar.y + 4 }, "no scored trial"),
  ]));
}
