// A trial's page: instruction, outcome and rewards, phases, usage and every model call, the
// transcript, the agent's and the verifier's output and the diff (files paged, never whole).
import {
  add, api, badge, clear, count, every, failure, h, money, number, plural, runLink, seconds, stateOf, table, when,
} from "./dom.js";

const CHUNK = 64 * 1024;
const SHOWN = [
  ["Agent output", ["agent/stdout.txt", "agent/stderr.txt"]],
  ["Verifier output", ["verifier/stdout.txt", "verifier/stderr.txt", "verifier/reward.json", "verifier/reward.txt"]],
  ["Diff", ["diff.patch"]],
];

export async function showTrial(app, trialId) {
  const path = `/api/trials/${encodeURIComponent(trialId)}`;
  let data;
  try {
    data = await api(path);
  } catch (error) {
    clear(app, failure(error));
    return;
  }
  draw(app, data, path);
  if (!data.trial.is_finished) {
    let last = data.trial.status;
    const stop = every(2000, async () => {
      const next = await api(path);
      if (next.trial.status === last) return;
      last = next.trial.status;
      draw(app, next, path);
      if (next.trial.is_finished) stop();
    });
  }
}

function draw(app, data, path) {
  const t = data.trial;
  document.title = `${t.item_id} · HEMRA`;
  const state = stateOf(t);
  const files = new Map(data.files.map((f) => [f.path, f.size]));
  const calls = h("div", { id: "calls" }, h("p", { class: "muted" }, "Loading calls…"));
  const transcript = h("div", { id: "transcript" }, h("p", { class: "muted" }, "Loading the transcript…"));
  clear(app,
    h("p", { class: "small" }, h("a", { href: "/" }, "Runs"), " / ",
      h("a", { href: runLink(data.run.id) }, data.run.name), " / ", t.id),
    h("h1", {}, t.item_id, " ", badge(state)),
    h("div", { class: "meta" },
      h("span", {}, "reward ", h("b", { id: "reward" }, t.reward === null ? "-" : String(t.reward))),
      h("span", {}, "status ", h("b", {}, t.status)),
      h("span", {}, "exit code ", h("b", {}, t.exit_code ?? "-")),
      h("span", {}, "duration ", h("b", {}, seconds(t.duration))),
      h("span", {}, "started ", h("b", {}, when(data.started_at))),
      h("span", {}, "worker ", h("b", {}, data.worker || "-")),
      t.retries ? h("span", {}, "retries ", h("b", {}, t.retries)) : null,
      t.replaces ? h("span", {}, "replaces ", h("a", { href: `/trials/${encodeURIComponent(t.replaces)}` }, t.replaces)) : null,
      t.stopped_by ? h("span", {}, "stopped by ", h("b", {}, t.stopped_by)) : null),
    t.error ? h("pre", { class: "error", id: "trial-error" }, t.error) : null,
    data.tampered ? tampered(data.tampered) : null,
    h("h2", {}, "Instruction"),
    instruction(data.instruction),
    h("div", { class: "columns" },
      h("div", {},
        h("h2", {}, "Reward"),
        Object.keys(t.rewards).length
          ? table(["key", "value"], Object.entries(t.rewards).map(([k, v]) => [k, String(v)]), { id: "rewards" })
          : h("p", { class: "muted" }, "No reward.json keys."),
        data.judgments.length ? [h("h3", {}, "Judges"), table(
          ["judge", "score", "rationale", "error", "tokens", "cost"],
          data.judgments.map((j) => [j.judge, number(j.score), h("td", { class: "wrap" }, j.rationale || ""),
            h("td", { class: "wrap" }, j.error || ""), count((j.input_tokens || 0) + (j.output_tokens || 0)), money(j.cost)]))] : null),
      h("div", {},
        h("h2", {}, "Phases"),
        phases(data.phases, t.duration)),
      h("div", {},
        h("h2", {}, "Usage"),
        table(["calls", "input", "output", "cache read", "cache write", "tokens", "cost"], [[
          count(data.usage.calls), count(data.usage.input_tokens), count(data.usage.output_tokens),
          count(data.usage.cache_read_tokens), count(data.usage.cache_write_tokens), count(data.usage.tokens),
          money(data.usage.cost)]]),
        t.models.length ? h("p", { class: "small muted" }, `models: ${t.models.join(", ")}`) : null)),
    h("h2", {}, "Model calls"), calls,
    h("h2", {}, "Transcript"), transcript,
    SHOWN.map(([title, names]) => [
      h("h2", {}, title),
      names.some((n) => files.has(n))
        ? names.filter((n) => files.has(n)).map((n) => filePane(path, n, files.get(n)))
        : h("p", { class: "muted" }, data.folder_error || `No ${names.join(" or ")} in the trial folder.`),
    ]),
    h("h2", {}, "Trial folder"),
    folder(path, data),
  );
  loadCalls(calls, path);
  loadTranscript(transcript, path);
}

// what made the trial `tampered` (its tampered.json): each path the agent changed, and why
function tampered(found) {
  const more = found.total - found.evidence.length;
  return h("div", { id: "tampered" },
    h("h2", {}, "Tampered"),
    h("p", {}, found.reason),
    h("ul", {}, found.evidence.map((line) => h("li", { class: "wrap" }, line))),
    more > 0 ? h("p", { class: "muted" }, `… ${more} more in tampered.json`) : null);
}

function instruction(found) {
  if (found.text === null) return h("p", { class: "muted" }, `Not available: ${found.error}`);
  return [
    h("pre", { id: "instruction" }, found.text),
    found.truncated ? h("p", { class: "muted small" }, "(the beginning only: the file is longer)") : null,
  ];
}

function phases(found, total) {
  const entries = Object.entries(found);
  if (!entries.length) return h("p", { class: "muted" }, "No phases recorded.");
  const longest = Math.max(...entries.map(([, v]) => v), 0.001);
  return table(["phase", "seconds", ""], entries.map(([name, value]) => {
    const bar = h("span", { class: "bar" });
    bar.style.width = `${Math.round((120 * value) / longest)}px`;
    return [name, number(value, 2), h("td", { class: "left" }, bar)];
  }).concat(total ? [[h("td", {}, h("b", {}, "trial")), number(total, 2), ""]] : []), { id: "phases" });
}

async function loadCalls(box, path) {
  try {
    const { calls } = await api(`${path}/calls`);
    if (!calls.length) {
      clear(box, h("p", { class: "muted" }, "No model calls through the gateway."));
      return;
    }
    clear(box, table(
      ["#", "role", "model", "status", "input", "output", "cache read", "cache write", "cost", "latency", "first byte", "error"],
      calls.map((c, i) => [String(i + 1), c.role, c.model || c.model_requested || "-", String(c.status) + (c.refused ? " refused" : ""),
        count(c.input_tokens), count(c.output_tokens), count(c.cache_read_tokens), count(c.cache_write_tokens),
        money(c.cost), seconds(c.latency), seconds(c.ttfb), h("td", { class: "wrap" }, c.error || "")]),
      { id: "calls-table" }));
  } catch (error) {
    clear(box, failure(error));
  }
}

async function loadTranscript(box, path, offset = 0) {
  try {
    const page = await api(`${path}/transcript?offset=${offset}&limit=200`);
    if (offset === 0) clear(box);
    if (!page.has_trajectory) {
      add(box, [h("p", { class: "muted" }, "No trajectory.json: the harness made no model call through the gateway.")]);
      return;
    }
    if (offset === 0) add(box, [h("p", { class: "muted small" }, `${plural(page.total, "message")} (${page.wire || "unknown wire"}, from call ${page.main_call ?? "-"})`)]);
    add(box, page.messages.map(message));
    const shown = page.offset + page.messages.length;
    if (shown < page.total) {
      const more = h("button", { onclick: () => { more.remove(); loadTranscript(box, path, shown); } }, `more messages (${page.total - shown} left)`);
      add(box, [more]);
    }
  } catch (error) {
    clear(box, failure(error));
  }
}

function message(m) {
  const cut = (key) => (m[`${key}_truncated`] ? h("p", { class: "muted small" }, `(cut at 64 KiB of ${m[`${key}_truncated`]} characters; trajectory.json has it whole)`) : null);
  return h("div", { class: `message ${["system", "user", "assistant", "tool"].includes(m.role) ? m.role : "other"}` },
    h("div", { class: "role" }, m.role, m.tool_call_id ? ` · ${m.tool_call_id}` : ""),
    m.text ? [h("pre", {}, m.text), cut("text")] : null,
    (m.tool_calls || []).map((call) => h("div", { class: "tool-call" },
      h("span", { class: "name" }, `→ ${call.name || "tool"}`), " ", h("span", { class: "muted small" }, call.id || ""),
      h("pre", {}, call.arguments || ""))),
    m.output !== undefined ? [h("pre", {}, m.output), cut("output")] : null);
}

function folder(path, data) {
  if (!data.files.length) return h("p", { class: "muted" }, data.folder_error || "The trial folder is empty or not there yet.");
  const pane = h("div");
  return [
    table(["file", "bytes", ""], data.files.map((f) => [f.path, count(f.size),
      h("td", {}, h("button", { onclick: () => clear(pane, filePane(path, f.path, f.size)) }, "show"))]), { id: "files" }),
    pane,
  ];
}

// One file of the trial folder, read CHUNK bytes at a time by byte offset.
function filePane(path, name, size) {
  const text = h("pre", { "data-file": name });
  const status = h("span");
  const more = h("button", { hidden: true }, "load more");
  const pane = h("div", { class: "file-pane" },
    h("div", { class: "head" }, h("b", {}, name), status, more), text);
  let next = 0;
  async function load() {
    more.disabled = true;
    try {
      const chunk = await api(`${path}/files/${name.split("/").map(encodeURIComponent).join("/")}?offset=${next}&limit=${CHUNK}`);
      if (chunk.is_binary) {
        text.replaceWith(h("p", { class: "muted" }, `binary file, ${plural(chunk.size, "byte")}`));
        return;
      }
      add(text, name.endsWith(".patch") ? diffLines(chunk.text) : [chunk.text]);
      next = chunk.next_offset;
      const end = next === null ? chunk.size : next;
      status.textContent = `bytes 0–${count(end)} of ${count(chunk.size)}`;
      more.hidden = next === null;
      more.disabled = false;
    } catch (error) {
      status.textContent = error.message;
    }
  }
  more.addEventListener("click", load);
  if (size === 0) {
    status.textContent = "empty";
    text.hidden = true;
  }
  else load();
  return pane;
}

function diffLines(text) {
  return text.split(/(?<=\n)/).map((line) => {
    const kind = line.startsWith("+") && !line.startsWith("+++") ? "add"
      : line.startsWith("-") && !line.startsWith("---") ? "del" : line.startsWith("@@") ? "hunk" : null;
    return kind ? h("span", { class: kind }, line) : line;
  });
}
