// The runs page: every run with its progress, updated live, and a cancel action.
import { api, clear, every, failure, h, runLink, runStatus, when, count } from "./dom.js";
import { cancelButton } from "./cancel.js";

const COUNTS = ["queued", "running", "finished", "cancelled"];

export async function showRuns(app) {
  const body = h("tbody");
  const message = h("div");
  const kept = h("ul", { id: "engine-kept", class: "flags" });
  const confirming = new Set();
  clear(app,
    h("h1", {}, "Runs"),
    h("p", { class: "muted" }, "Every run in the store, newest first; progress updates by itself."),
    kept,
    message,
    h("div", { class: "scroll" }, h("table", { id: "runs" },
      h("thead", {}, h("tr", {},
        ["run", "created", "status", "harnesses", "datasets", "progress", ...COUNTS, "outcomes", ""]
          .map((name) => h("th", {}, name)))),
      body)));

  let last = "";
  async function refresh() {
    const { runs, engine_kept: stuck } = await api("/api/runs");
    const seen = JSON.stringify([runs, stuck]);
    if (seen === last) return;
    last = seen;
    // what the engine kept that HEMRA could not remove, with what to do (as `hemra runs` says)
    clear(kept, Object.entries(stuck || {}).map(([name, why]) =>
      h("li", {}, `the engine kept ${name}: ${why}`)));
    if (runs.length === 0) {
      clear(body, h("tr", {}, h("td", { colspan: 11, class: "muted" }, "No runs in this store yet.")));
      return;
    }
    clear(body, runs.map((run) => row(run, confirming, message, refresh)));
  }
  try {
    await refresh();
  } catch (error) {
    clear(app, failure(error));
    return;
  }
  every(1500, refresh);
}

export function progressBar(progress) {
  const total = progress.total || 1;
  const part = (name, state) => {
    const bar = h("span", { class: `o-${state}`, title: `${progress[name]} ${name}` });
    bar.style.width = `${(100 * progress[name]) / total}%`;
    return bar;
  };
  return h("span", { class: "progress" },
    part("finished", "pass"), part("cancelled", "cancelled"), part("running", "running"));
}

function row(run, confirming, message, refresh) {
  const p = run.progress;
  return h("tr", { "data-run": run.id },
    h("td", { class: "left" }, h("a", { href: runLink(run.id) }, run.name), h("div", { class: "muted small" }, run.id)),
    h("td", { class: "list" }, when(run.created_at)),
    h("td", { class: "status" }, runStatus(run)),
    h("td", { class: "left list" }, run.harnesses.join(", ")),
    h("td", { class: "left list" }, run.datasets.map((d) => `${d.name} (${d.tasks})`).join(", ")),
    h("td", { class: "left" }, progressBar(p), " ", h("span", { class: "done" }, `${count(p.finished + p.cancelled)}/${count(p.total)}`)),
    COUNTS.map((name) => h("td", { class: `count-${name}` }, count(p[name]))),
    h("td", { class: "left small list" }, Object.entries(run.outcomes).map(([k, v]) => `${k} ${v}`).join(", ")),
    h("td", {}, run.is_active ? cancelButton(run.id, confirming, message, refresh) : ""));
}
