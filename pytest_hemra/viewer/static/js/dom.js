// Building blocks shared by every page. Text from the store or a trial folder is never parsed as
// HTML: elements are made with createElement and filled with text nodes (textContent), so an
// agent's `<script>` is shown, never run; and its control characters are shown as visible
// symbols (`visible`), so an ESC, a CR or a bidirectional override in a file name or an output
// neither hides nor reorders what is around it.

// C0 controls but newline and tab, DEL, C1 controls, line separators, bidirectional overrides
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

export function visible(text) {
  return String(text).replace(CONTROL, (found) => {
    const code = found.charCodeAt(0);
    if (code < 0x20) return String.fromCharCode(0x2400 + code); // ␛ for ESC, ␍ for CR...
    if (code === 0x7f) return "\u2421"; // ␡
    return code <= 0xff ? `\\x${code.toString(16)}` : `\\u${code.toString(16)}`;
  });
}

export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  setAttributes(element, attrs);
  add(element, children);
  return element;
}

export function svg(tag, attrs = {}, ...children) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
  setAttributes(element, attrs);
  add(element, children);
  return element;
}

function setAttributes(element, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else element.setAttribute(key, value === true ? "" : visible(value));
  }
}

export function add(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(visible(child)));
  }
  return element;
}

export function clear(element, ...children) {
  element.replaceChildren();
  return add(element, children);
}

export class ApiError extends Error {}

export async function api(path, options = {}) {
  const response = await fetch(path, {
    credentials: "same-origin",
    headers: { Accept: "application/json", ...(options.body ? { "Content-Type": "application/json" } : {}) },
    ...options,
  });
  let data = null;
  try {
    data = await response.json();
  } catch {
    throw new ApiError(`${path}: HTTP ${response.status}, expected a JSON answer`);
  }
  if (!response.ok) throw new ApiError(data && data.error ? data.error : `${path}: HTTP ${response.status}`);
  return data;
}

// Every outcome, its groups (scored, failed, error, unfinished) and the states a trial can show:
// its outcome, or its status while it has none. The server owns the lists (GET /api/outcomes);
// when it cannot be read, every state shows as "other" and the page says what went wrong.
export const OUTCOME_GROUPS = await api("/api/outcomes").catch(() => ({ states: [] }));
export const OUTCOMES = OUTCOME_GROUPS.states;

// A trial's state: its outcome, or its status while it has none.
export function stateOf(trial) {
  const state = trial.outcome || trial.status;
  return OUTCOMES.includes(state) ? state : "other";
}

export function badge(state) {
  return h("span", { class: `badge o-${OUTCOMES.includes(state) ? state : "other"}` }, state);
}

export function legend() {
  return h("div", { class: "legend" }, OUTCOMES.map((o) => h("span", {}, h("i", { class: `o-${o}` }), o)));
}

// A run's status, and for a run waiting for its engine (a Docker daemon restarting) which one.
export function runStatus(run) {
  const engines = (run.waiting || []).map((wait) => wait.engine);
  if (engines.length) return `${run.status} for engine ${engines.join(", ")}`;
  // stopped by Ctrl-C: what `hemra run --resume RUN_ID` would run
  if (run.status === "interrupted") return `interrupted (${run.progress.left} left)`;
  return run.status;
}

export const runLink = (id) => `/runs/${encodeURIComponent(id)}`;
export const trialLink = (id) => `/trials/${encodeURIComponent(id)}`;

export function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "-";
}

export function number(value, digits = 3) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

export function count(value) {
  return value === null || value === undefined ? "-" : Number(value).toLocaleString("en-US");
}

export function money(value) {
  return value === null || value === undefined ? "unknown" : `$${Number(value).toFixed(4)}`;
}

export function seconds(value) {
  return value === null || value === undefined ? "-" : `${Number(value).toFixed(2)} s`;
}

export function estimate(value) {
  if (!value) return "-";
  if (value.low === value.high) return number(value.mean);
  return `${number(value.mean)} [${number(value.low)}, ${number(value.high)}]`;
}

export function signed(value) {
  return value === null || value === undefined ? "-" : (value >= 0 ? "+" : "") + Number(value).toFixed(3);
}

export function table(headers, rows, attrs = {}) {
  return h("div", { class: "scroll" },
    h("table", attrs,
      h("thead", {}, h("tr", {}, headers.map((name) => h("th", {}, name)))),
      h("tbody", {}, rows.map((row) => row instanceof Node ? row : h("tr", {}, row.map((cell) => cell instanceof Node && cell.tagName === "TD" ? cell : h("td", {}, cell)))))));
}

// Calls `step` now and then every `ms` after it settles, while the page stays open.
export function every(ms, step) {
  const live = document.getElementById("live");
  let stopped = false;
  async function tick() {
    if (stopped) return;
    try {
      await step();
      if (live) live.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      if (live) live.textContent = `live · ${error.message}`;
    }
    if (!stopped) setTimeout(tick, ms);
  }
  setTimeout(tick, ms);
  return () => { stopped = true; };
}

export function failure(error) {
  return h("p", { class: "error" }, error.message || String(error));
}

// `1 task`, `2 tasks` (`many` where `+s` is wrong: plural(2, "sandbox", "sandboxes")), as
// pytest_hemra/core/words.py says them.
export function plural(value, noun, many = undefined) {
  return `${count(value)} ${Number(value) === 1 ? noun : many ?? `${noun}s`}`;
}
