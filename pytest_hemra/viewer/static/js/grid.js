// The trial grid: one row per task, one column per harness, one square per attempt, colored by
// outcome; filtered by harness, dataset, task, outcome and text, paged by the API.
import { OUTCOMES, add, api, clear, count, h, legend, plural, stateOf, trialLink } from "./dom.js";

const PAGE = 300;

export function makeGrid(run) {
  const params = new URLSearchParams(location.search);
  const state = {
    harness: params.get("harness") || "",
    dataset: params.get("dataset") || "",
    task: params.get("task") || "",
    outcome: params.get("outcome") || "",
    text: params.get("text") || "",
    offset: Number(params.get("offset") || 0),
  };
  const summary = h("div", { class: "toolbar" });
  const body = h("div", { class: "scroll" });
  const tasks = [...new Set(run.datasets.flatMap((d) => d.tasks))];
  const select = (name, values) => h("select", { name, onchange: (e) => change(name, e.target.value) },
    h("option", { value: "" }, "any"),
    values.map((v) => h("option", { value: v, selected: v === state[name] }, v)));
  let timer = null;
  const typed = (name, attrs) => h("input", { name, value: state[name], ...attrs, oninput: (e) => {
    clearTimeout(timer);
    timer = setTimeout(() => change(name, e.target.value.trim()), 250);
  } });
  const form = h("form", { class: "filters", onsubmit: (e) => e.preventDefault() },
    h("label", {}, "harness", select("harness", run.harnesses)),
    run.datasets.length > 1 ? h("label", {}, "dataset", select("dataset", run.datasets.map((d) => d.name))) : null,
    h("label", {}, "task", typed("task", { list: "task-names", placeholder: "exact name", size: 18 })),
    h("datalist", { id: "task-names" }, tasks.slice(0, 5000).map((t) => h("option", { value: t }))),
    h("label", {}, "outcome", select("outcome", OUTCOMES)),
    h("label", {}, "text", typed("text", { type: "search", placeholder: "in item id or error", size: 22 })));
  const element = h("div", { id: "grid" }, form, legend(), summary, body);

  function change(name, value) {
    state[name] = value;
    state.offset = 0;
    const query = new URLSearchParams();
    for (const [key, val] of Object.entries(state)) if (val && !(key === "offset" && val === 0)) query.set(key, val);
    const rest = query.toString();
    history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : ""));
    load();
  }

  let loading = 0;
  async function load() {
    const mine = ++loading;
    const query = new URLSearchParams({ limit: PAGE, offset: state.offset });
    for (const key of ["harness", "dataset", "task", "outcome", "text"]) if (state[key]) query.set(key, state[key]);
    let page;
    try {
      page = await api(`/api/runs/${encodeURIComponent(run.id)}/trials?${query}`);
    } catch (error) {
      clear(body, h("p", { class: "error" }, error.message));
      return;
    }
    if (mine !== loading) return; // a newer filter's answer wins
    drawSummary(page);
    clear(body, drawTable(page.trials));
  }

  function drawSummary(page) {
    const first = page.total ? page.offset + 1 : 0;
    const lastShown = page.offset + page.trials.length;
    const move = (offset) => { state.offset = Math.max(0, offset); load(); };
    clear(summary,
      h("span", { class: "matching" }, `${plural(page.total, "trial")} ${page.total === 1 ? "matches" : "match"}`),
      h("span", { class: "muted" }, `showing ${count(first)}–${count(lastShown)}`),
      h("button", { disabled: page.offset === 0, onclick: () => move(page.offset - PAGE) }, "previous"),
      h("button", { disabled: lastShown >= page.total, onclick: () => move(page.offset + PAGE) }, "next"));
  }

  function drawTable(trials) {
    if (trials.length === 0) return h("p", { class: "muted" }, "No trial matches these filters.");
    const harnesses = state.harness ? [state.harness] : run.harnesses;
    const rows = new Map();
    for (const trial of trials) {
      const key = `${trial.dataset}\u0000${trial.task}`;
      if (!rows.has(key)) rows.set(key, { dataset: trial.dataset, task: trial.task, cells: new Map() });
      const cells = rows.get(key).cells;
      if (!cells.has(trial.harness)) cells.set(trial.harness, []);
      cells.get(trial.harness).push(trial);
    }
    const many = run.datasets.length > 1;
    return h("table", { class: "grid" },
      h("thead", {}, h("tr", {}, h("th", {}, many ? "dataset / task" : "task"), harnesses.map((name) => h("th", { class: "left" }, name)))),
      h("tbody", {}, [...rows.values()].map((row) => h("tr", { "data-task": row.task },
        h("td", { class: "task" }, many ? `${row.dataset} / ${row.task}` : row.task),
        harnesses.map((name) => add(h("td", { class: "left" }), (row.cells.get(name) || []).map(cell)))))));
  }

  function cell(trial) {
    const state = stateOf(trial);
    const reward = trial.reward === null ? "" : ` reward ${trial.reward}`;
    return h("a", {
      class: `cell o-${state}`, href: trialLink(trial.id), "data-trial": trial.id, "data-state": state,
      title: `${trial.item_id}: ${state}${reward}`,
    }, String(trial.attempt));
  }

  return { element, load };
}
