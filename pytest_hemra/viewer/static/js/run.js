// A run's page: what it is, its progress (live), its report and its trial grid.
import { api, clear, count, every, failure, h, plural, runStatus, when } from "./dom.js";
import { cancelButton } from "./cancel.js";
import { drawReport } from "./report.js";
import { makeGrid } from "./grid.js";
import { progressBar } from "./runs.js";

const COUNTS = ["queued", "running", "finished", "cancelled", "deselected", "total"];

export async function showRun(app, runId) {
  const path = `/api/runs/${encodeURIComponent(runId)}`;
  let run;
  try {
    run = await api(path);
  } catch (error) {
    clear(app, failure(error));
    return;
  }
  document.title = `${run.name} · HEMRA`;
  const progress = h("div", { id: "progress", class: "meta" });
  const message = h("div");
  const actions = h("div", { class: "toolbar" });
  const reportBox = h("div", { id: "report" }, h("p", { class: "muted" }, "Building the report…"));
  const grid = makeGrid(run);
  const others = run.harnesses.filter((name) => name !== run.baseline);
  clear(app,
    h("p", { class: "small" }, h("a", { href: "/" }, "Runs"), " / ", run.id),
    h("h1", {}, run.name),
    h("div", { class: "meta" },
      h("span", {}, "run ", h("b", {}, run.id)),
      h("span", {}, "status ", h("b", { id: "run-status" }, runStatus(run))),
      h("span", {}, "created ", h("b", {}, when(run.created_at))),
      h("span", {}, "baseline ", h("b", {}, run.baseline || "-")),
      run.models && run.models.length
        ? h("span", {}, "models ", h("b", {}, run.models.join(", ")))
        : h("span", {}, "model ", h("b", {}, run.model || "-")),
      h("span", {}, "attempts ", h("b", {}, run.attempts ?? "-")),
      h("span", {}, "datasets ", h("b", {}, run.datasets.map((d) => `${d.name} (${plural(d.tasks.length, "task")})`).join(", ")))),
    progress, actions, message,
    h("h2", {}, "Report"), reportBox,
    h("h2", {}, "Trials"), grid.element);

  function drawProgress(current) {
    const p = current.progress;
    clear(progress, progressBar(p), COUNTS.map((name) =>
      h("span", {}, `${name} `, h("b", { class: `count-${name}` }, count(p[name])))));
    document.getElementById("run-status").textContent = runStatus(current);
    const confirming = new Set();
    clear(actions,
      current.is_active ? cancelButton(run.id, confirming, message, refresh) : null,
      others.length ? h("a", { href: `/compare?${new URLSearchParams({ run: run.id, a: run.baseline, b: others[0] })}` },
        "compare two harnesses") : null);
  }

  let reportLoading = false;
  let reportWanted = false;
  async function loadReport() {
    if (reportLoading) { reportWanted = true; return; }
    reportLoading = true;
    try {
      drawReport(reportBox, await api(`${path}/report`));
    } catch (error) {
      clear(reportBox, failure(error));
    }
    reportLoading = false;
    if (reportWanted) { reportWanted = false; loadReport(); }
  }

  let last = JSON.stringify([run.status, run.progress, run.outcomes]);
  async function refresh() {
    const current = await api(path);
    const seen = JSON.stringify([current.status, current.progress, current.outcomes]);
    if (seen === last) return;
    last = seen;
    drawProgress(current);
    grid.load();
    loadReport();
  }
  drawProgress(run);
  grid.load();
  loadReport();
  every(1500, refresh);
}
