// The router: every page is this one document; the address says which page to draw.
import { clear, failure } from "./dom.js";
import { showRuns } from "./runs.js";
import { showRun } from "./run.js";
import { showTrial } from "./trial.js";
import { showCompare } from "./compare.js";

const params = new URLSearchParams(location.search);
if (params.has("token")) {
  // The token is now in an HttpOnly cookie; keep it out of the address bar and history.
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : "") + location.hash);
}

const app = document.getElementById("app");
const path = location.pathname;
const match = (pattern) => {
  const found = path.match(pattern);
  return found ? decodeURIComponent(found[1]) : null;
};

async function route() {
  const run = match(/^\/runs\/([^/]+)$/);
  const trial = match(/^\/trials\/([^/]+)$/);
  if (path === "/") return showRuns(app);
  if (run !== null) return showRun(app, run);
  if (trial !== null) return showTrial(app, trial);
  if (path === "/compare") return showCompare(app, new URLSearchParams(location.search));
  clear(app, failure(new Error(`${path}: no such page (expected /, /runs/ID, /trials/ID or /compare)`)));
}

route().catch((error) => clear(app, failure(error)));
