// The cancel action: one click asks, a second confirms (no browser dialog), then it POSTs.
import { api, clear, h, plural } from "./dom.js";

export function cancelButton(runId, confirming, message, refresh) {
  const box = h("span", { class: "cancel" });
  const draw = () => {
    if (!confirming.has(runId)) {
      clear(box, h("button", { class: "danger", onclick: () => { confirming.add(runId); draw(); } }, "cancel"));
      return;
    }
    const yes = h("button", { class: "danger confirm", onclick: async () => {
      yes.disabled = true;
      try {
        const done = await api(`/api/runs/${encodeURIComponent(runId)}/cancel`, {
          method: "POST", body: JSON.stringify({ wait: 10 }),
        });
        const note = done.sandbox_error ? `; sandboxes not removed: ${done.sandbox_error}` : "";
        clear(message, h("p", { class: "notice" },
          `run ${runId}: ${plural(done.cancelled, "trial")} cancelled, ${plural(done.removed, "sandbox", "sandboxes")} removed${note}`));
      } catch (error) {
        clear(message, h("p", { class: "error" }, `cancel ${runId}: ${error.message}`));
      }
      confirming.delete(runId);
      await refresh();
    } }, "confirm cancel");
    clear(box, yes, " ", h("button", { onclick: () => { confirming.delete(runId); draw(); } }, "keep"));
  };
  draw();
  return box;
}
