// normcal judging page: keyboard-first relevance judging of one collection.
// Everything it shows comes from the /v1 API, called through key.js (the API key).
// The data model is general: a query and a list of candidate texts (`hits`), each
// judged relevant or not, posted as feedback for the next fit.
// A judge key judges; fitting needs a write key, so the page asks GET /v1/key what it has.
"use strict";

const HITS = 5;
const SUGGESTIONS = 5;
const SCORES_STORAGE = "normcal-show-scores";
const root = new URL("../../../", location.href); // this page is /ui/collections/{c}/judge
const collection = decodeURIComponent(location.pathname.split("/").slice(-2)[0]);
const api = new URL(`v1/collections/${encodeURIComponent(collection)}/`, root);
const FIT_ROLES = ["write", "admin"];

const $ = (id) => document.getElementById(id);
normcal.bindKey($("key"), () => {
  role = null;
  load();
});

let role = null; // the key's role (GET /v1/key); null: not known
let current = null; // the JudgingNext being judged
let hitIndex = 0;
let judgedHere = 0; // judgments posted for the current query
let busy = false;
// What undo takes back, newest last: {kind: "judge" | "skip", query, docId, state}
// with the page's state from before the action.
const history = [];

const call = (method, path, body) => normcal.json(new URL(path, api), { method, body });

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

// Runs one request at a time; keys pressed meanwhile are ignored.
async function exclusive(work) {
  if (busy) return;
  busy = true;
  $("error").textContent = "";
  $("message").textContent = "";
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

function snapshot() {
  return { current: structuredClone(current), hitIndex, judgedHere };
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
  $("undo").disabled = history.length === 0;
  const hit = current.hits[hitIndex];
  $("query").textContent = current.query || "";
  const from = current.rerank
    ? "from a logged rerank request: its own documents"
    : `from the ${current.source === "log" ? "query log" : "uploaded list"}`;
  $("source").textContent = current.query ? `(${current.typed ? "typed here" : from})` : "";
  $("position").textContent = hit ? `${hitIndex + 1} of ${current.hits.length}` : "";
  $("score").textContent = hit
    ? `· cosine ${hit.score.toFixed(3)}` +
      (hit.probability === null ? "" : ` · P(relevant) ${hit.probability.toFixed(2)}`)
    : "";
  $("hit").textContent = hit ? hit.text : "";
  $("hit").dataset.docId = hit ? hit.id : "";
  $("suggestions").hidden = current.query !== null || !current.suggestions?.length;
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

// No query to judge: say so, and how to get some (type them, queue them, log
// searches, or take the suggestions drawn from the documents).
function showNothingToJudge() {
  const p = current.progress;
  const path = `/v1/collections/${encodeURIComponent(collection)}`;
  const log = current.queryLog;
  const head = p.judged_queries + p.skipped === 0
    ? "No query to judge yet."
    : `Nothing left to judge: ${p.judged_queries} judged, ${p.skipped} skipped.`;
  const typed = ["Type a question your users ask into the box above (", { code: "a" },
    "), and judge its hits."];
  const queue = [
    "Queue many: ", { code: `POST ${path}/judging/queries` }, " with ",
    { code: '{"queries": ["…", "…"]}' }, ".",
  ];
  const logged = log && log.enabled
    ? [`The query log is on (${log.entries} logged): queries searched from now on appear here too.`]
    : [
      "Or turn on the query log, ", { code: `PUT ${path}/query-log` }, " with ",
      { code: '{"enabled": true}' }, ", and the queries searched from then on appear here.",
    ];
  $("empty").replaceChildren(
    ...paragraphs([head], typed, queue, logged, ["Then press ", { code: "n" }, " to look again."]),
  );
  $("suggested").replaceChildren(
    ...(current.suggestions || []).map((s) => {
      const item = document.createElement("li");
      const button = Object.assign(document.createElement("button"), {
        type: "button",
        textContent: s.query,
        title: `the most distinctive words of document ${s.document_id}`,
      });
      button.addEventListener("click", () => addQuery(s.query));
      item.append(button);
      return item;
    }),
  );
}

// The next query (or `query`, which the judge asked for), and what to show with it.
function load(query) {
  return exclusive(async () => {
    showLoading();
    if (role === null) {
      const key = await call("GET", new URL("v1/key", root).href).catch(() => null);
      role = key && key.role;
    }
    const asked = query === undefined ? "" : `&query=${encodeURIComponent(query)}`;
    current = await call("GET", `judging/next?k=${HITS}${asked}`);
    current.typed = query !== undefined;
    if (!current.query) {
      // Whether searches are logged changes the advice; with nothing logged, the
      // collection's own words suggest where to start.
      current.queryLog = await call("GET", "query-log").catch(() => null);
      if (!current.queryLog || current.queryLog.entries === 0) {
        const found = await call("GET", `judging/suggestions?n=${SUGGESTIONS}`).catch(() => null);
        current.suggestions = found ? found.data : [];
      }
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
    const before = snapshot();
    await call("POST", "feedback", {
      judgments: [{ query: current.query, document_id: hit.id, relevance }],
    });
    history.push({ kind: "judge", query: current.query, docId: hit.id, state: before });
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
  if (current && current.query && hitIndex >= current.hits.length) await load();
}

async function skip() {
  if (busy || !current || !current.query) return;
  await exclusive(async () => {
    const before = snapshot();
    await call("POST", "judging/skip", { query: current.query });
    history.push({ kind: "skip", query: current.query, state: before });
  });
  await load();
}

async function nextQuery() {
  if (busy || !current) return;
  if (current.query && judgedHere === 0) return skip();
  await load();
}

// Take back the last judgment or skip, and show that query and hit again.
async function undo() {
  if (busy || history.length === 0) return;
  await exclusive(async () => {
    const last = history[history.length - 1];
    const query = encodeURIComponent(last.query);
    if (last.kind === "judge") {
      await call("DELETE", `judging/judgment?query=${query}&document_id=${encodeURIComponent(last.docId)}`);
    } else {
      await call("DELETE", `judging/skip?query=${query}`);
    }
    history.pop();
    ({ current, hitIndex, judgedHere } = last.state);
    $("message").textContent = last.kind === "judge"
      ? "Undone: judge this hit again."
      : "Undone: the query is back.";
    render();
  });
}

// A query the judge typed (or picked from the suggestions): queued, so it is kept
// if the page closes, and offered again if it was skipped; then judged right away.
async function addQuery(text) {
  const query = text.trim();
  if (busy || !query) return;
  let ok = false;
  await exclusive(async () => {
    const { added } = await call("POST", "judging/queries", { queries: [query] });
    if (added === 0) await call("DELETE", `judging/skip?query=${encodeURIComponent(query)}`).catch(() => null);
    ok = true;
  });
  if (!ok) return;
  $("new-query").value = "";
  $("new-query").blur();
  await load(query);
}

async function queueSuggestions() {
  if (busy || !current || !current.suggestions?.length) return;
  await exclusive(() => call("POST", "judging/queries", {
    queries: current.suggestions.map((s) => s.query),
  }));
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

// Cosine and P(relevant) stay hidden unless asked for: they invite anchoring.
function showScores(shown) {
  document.body.dataset.scores = shown ? "shown" : "hidden";
  $("show-scores").checked = shown;
  sessionStorage.setItem(SCORES_STORAGE, shown ? "1" : "");
}
showScores(sessionStorage.getItem(SCORES_STORAGE) === "1");

const KEYS = {
  j: () => judge(1), 1: () => judge(1),
  k: () => judge(0), 0: () => judge(0),
  s: skip, n: nextQuery, Enter: nextQuery, f: fit, u: undo,
  p: () => showScores(document.body.dataset.scores !== "shown"),
  a: () => $("new-query").focus(),
};

document.addEventListener("keydown", (event) => {
  if (event.target === $("new-query") && event.key === "Escape") {
    $("new-query").blur();
    return;
  }
  if (event.target.closest("input, textarea") || event.ctrlKey || event.metaKey || event.altKey) return;
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
$("undo").addEventListener("click", undo);
$("fit").addEventListener("click", fit);
$("show-scores").addEventListener("change", (event) => showScores(event.target.checked));
$("queue-all").addEventListener("click", queueSuggestions);
$("add").addEventListener("submit", (event) => {
  event.preventDefault();
  addQuery($("new-query").value);
});

load();
