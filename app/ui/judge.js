// normcal judging page: keyboard-first relevance judging of one collection.
// Everything it shows comes from the /v1 API; the API key (if the server has one)
// is typed into the page, kept in sessionStorage and sent as a bearer token. A judge
// key judges; fitting needs a write key, so the page asks GET /v1/key what it has.
"use strict";

const KEY_STORAGE = "normcal-api-key";
const HITS = 5;
const root = new URL("../../../", location.href); // this page is /ui/collections/{c}/judge
const collection = decodeURIComponent(location.pathname.split("/").slice(-2)[0]);
const api = new URL(`v1/collections/${encodeURIComponent(collection)}/`, root);
const FIT_ROLES = ["write", "admin"];

const $ = (id) => document.getElementById(id);
const keyInput = $("key");
keyInput.value = sessionStorage.getItem(KEY_STORAGE) || "";
keyInput.addEventListener("change", () => {
  sessionStorage.setItem(KEY_STORAGE, keyInput.value.trim());
  role = null;
  load();
});

let role = null; // the key's role (GET /v1/key); null: not known
let current = null; // the JudgingNext being judged
let hitIndex = 0;
let judgedHere = 0; // judgments posted for the current query
let busy = false;

function setState(state) {
  document.body.dataset.state = state;
  document.body.dataset.seq = String(Number(document.body.dataset.seq) + 1);
  document.querySelector("main").setAttribute("aria-busy", "false");
}

// While a query loads: "Loading the next query…" shows instead of the card. The
// render that follows bumps data-seq; this does not (it is not an outcome).
function showLoading() {
  document.body.dataset.state = "loading";
  document.querySelector("main").setAttribute("aria-busy", "true");
}

async function call(method, path, body) {
  const headers = { accept: "application/json" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.authorization = `Bearer ${key}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(new URL(path, api), {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    let detail = `${response.status} ${response.statusText}`;
    try {
      const problem = await response.json();
      detail = `${problem.title}: ${problem.detail}`;
    } catch (_) { /* not a problem document */ }
    throw new Error(detail);
  }
  return response.status === 204 ? null : response.json();
}

// Runs one request at a time; keys pressed meanwhile are ignored.
async function exclusive(work) {
  if (busy) return;
  busy = true;
  $("error").textContent = "";
  try {
    await work();
  } catch (error) {
    $("error").textContent = String(error.message || error);
    setState("error");
  } finally {
    busy = false;
  }
}

// Unknown role: let the server decide (a 403 says which role a fit needs).
function mayFit() {
  return role === null || FIT_ROLES.includes(role);
}

function canFit() {
  const p = current.progress;
  return p.judged_queries >= p.target && p.relevant_queries > 0 && mayFit();
}

function render() {
  const p = current.progress;
  const total = p.judged_queries + p.remaining;
  $("collection").textContent = collection;
  $("progress").textContent =
    `${p.judged_queries} of ${total} queries judged` +
    ` · a fit needs ${p.target} judged queries, one with a relevant hit` +
    (mayFit() ? "" : ` · fitting needs a write key (this ${role} key judges)`);
  $("fit").disabled = !canFit();
  const hit = current.hits[hitIndex];
  $("query").textContent = current.query || "";
  const from = current.rerank
    ? "a logged rerank request: its own documents"
    : `the ${current.source === "log" ? "query log" : "uploaded list"}`;
  $("source").textContent = current.query ? `(from ${from})` : "";
  $("position").textContent = hit ? `${hitIndex + 1} of ${current.hits.length}` : "";
  $("score").textContent = hit
    ? `· cosine ${hit.score.toFixed(3)}` +
      (hit.probability === null ? "" : ` · P(relevant) ${hit.probability.toFixed(2)}`)
    : "";
  $("hit").textContent = hit ? hit.text : "";
  $("hit").dataset.docId = hit ? hit.id : "";
  if (current.query) return setState("judging");
  showNothingToJudge();
  setState(p.judged_queries + p.skipped === 0 ? "empty" : "done");
}

// Paragraphs of text and {code} parts, built as nodes (nothing is parsed as HTML).
function paragraphs(...lines) {
  return lines.map((parts) => {
    const p = document.createElement("p");
    for (const part of parts) {
      if (typeof part === "string") p.append(part);
      else p.append(Object.assign(document.createElement("code"), { textContent: part.code }));
    }
    return p;
  });
}

// No query to judge: say so, and how to get some (queue them, or log searches).
function showNothingToJudge() {
  const p = current.progress;
  const path = `/v1/collections/${encodeURIComponent(collection)}`;
  const log = current.queryLog;
  const head = p.judged_queries + p.skipped === 0
    ? "No query to judge yet."
    : `Nothing left to judge: ${p.judged_queries} judged, ${p.skipped} skipped.`;
  const queue = [
    "Queue queries: ", { code: `POST ${path}/judging/queries` }, " with ",
    { code: '{"queries": ["…", "…"]}' }, ".",
  ];
  const logged = log && log.enabled
    ? [`The query log is on (${log.entries} logged): queries searched from now on appear here too.`]
    : [
      "Or turn on the query log, ", { code: `PUT ${path}/query-log` }, " with ",
      { code: '{"enabled": true}' }, ", and the queries searched from then on appear here.",
    ];
  $("empty").replaceChildren(
    ...paragraphs([head], queue, logged, ["Then press ", { code: "n" }, " to look again."]),
  );
}

function load() {
  return exclusive(async () => {
    showLoading();
    if (role === null) {
      const key = await call("GET", new URL("v1/key", root).href).catch(() => null);
      role = key && key.role;
    }
    current = await call("GET", `judging/next?k=${HITS}`);
    if (!current.query) {
      // Whether searches are logged changes the advice; without it, give both.
      current.queryLog = await call("GET", "query-log").catch(() => null);
    }
    hitIndex = 0;
    judgedHere = 0;
    render();
  });
}

async function judge(relevance) {
  if (busy || !current || !current.query || !current.hits[hitIndex]) return;
  await exclusive(async () => {
    const hit = current.hits[hitIndex];
    await call("POST", "feedback", {
      judgments: [{ query: current.query, document_id: hit.id, relevance }],
    });
    const p = current.progress;
    if (judgedHere === 0) {
      p.judged_queries += 1;
      p.remaining = Math.max(0, p.remaining - 1);
    }
    if (relevance > 0 && !current.relevantHere) {
      current.relevantHere = true;
      p.relevant_queries += 1;
    }
    judgedHere += 1;
    hitIndex += 1;
    if (hitIndex < current.hits.length) render();
  });
  if (current && hitIndex >= current.hits.length) await load();
}

async function skip() {
  if (busy || !current || !current.query) return;
  await exclusive(() => call("POST", "judging/skip", { query: current.query }));
  await load();
}

async function nextQuery() {
  if (busy || !current) return;
  if (current.query && judgedHere === 0) return skip();
  await load();
}

async function fit() {
  if (busy || !current || !canFit()) return;
  await exclusive(async () => {
    setState("fitting");
    $("message").textContent = "Fitting a calibrator…";
    const info = await call("POST", "calibrators", {
      method: "auto",
      include_feedback: true,
    });
    const report = $("report");
    // The viewer page fetches the report with the key (a plain link cannot send it).
    report.href = new URL(
      `ui/collections/${encodeURIComponent(collection)}/calibrators/` +
        `${encodeURIComponent(info.id)}/report`,
      root,
    ).href;
    report.hidden = false;
    report.dataset.calibrator = info.id;
    $("message").textContent =
      `Fitted calibrator ${info.id} (${info.method}); it is now serving searches.`;
    setState("fitted");
  });
}

const KEYS = {
  j: () => judge(1), 1: () => judge(1),
  k: () => judge(0), 0: () => judge(0),
  s: skip, n: nextQuery, Enter: nextQuery, f: fit,
};

document.addEventListener("keydown", (event) => {
  if (event.target === keyInput || event.ctrlKey || event.metaKey || event.altKey) return;
  const action = KEYS[event.key];
  if (action) {
    event.preventDefault();
    action();
  }
});
$("relevant").addEventListener("click", () => judge(1));
$("irrelevant").addEventListener("click", () => judge(0));
$("skip").addEventListener("click", skip);
$("next").addEventListener("click", nextQuery);
$("fit").addEventListener("click", fit);

load();
