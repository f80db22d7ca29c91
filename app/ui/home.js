// normcal home page: the collections, their documents and calibrators, and links to
// each one's judging page and calibration report. Data comes from GET /v1/collections,
// called through key.js (the API key).
"use strict";

const root = new URL("./", location.href); // this page is /
const $ = (id) => document.getElementById(id);
normcal.bindKey($("key"), load);

function link(text, path) {
  return Object.assign(document.createElement("a"), { textContent: text, href: new URL(path, root).href });
}

function cell(...content) {
  const td = document.createElement("td");
  td.append(...content);
  return td;
}

// What the calibrator status means for this collection, in a few words.
function calibratorText(c) {
  const ref = c.calibrator;
  if (!ref) return "";
  if (ref.status === "fitted") return `fitted on ${ref.n_queries} judged queries (${ref.method})`;
  if (ref.status === "default") return "shipped default: judge 5–10 queries to fit your own";
  return `none: ${ref.reason || "no calibrator"}`;
}

function row(c) {
  const tr = document.createElement("tr");
  tr.dataset.collection = c.name;
  const name = encodeURIComponent(c.name);
  if (c.status === "unavailable") {
    const td = cell(`unavailable: ${c.reason}`);
    td.colSpan = 4;
    tr.append(cell(c.name), td);
    return tr;
  }
  const ref = c.calibrator;
  const documents = cell(String(c.documents ?? ""));
  documents.className = "number";
  tr.append(
    cell(c.name),
    documents,
    cell(calibratorText(c)),
    cell(link("judge", `ui/collections/${name}/judge`)),
    cell(ref && ref.id
      ? link("report", `ui/collections/${name}/calibrators/${encodeURIComponent(ref.id)}/report`)
      : ""),
  );
  return tr;
}

async function load() {
  document.body.dataset.state = "loading";
  $("error").textContent = "";
  try {
    const list = await normcal.json(new URL("v1/collections", root));
    $("collections").tBodies[0].replaceChildren(...list.data.map(row));
    $("collections").hidden = list.data.length === 0;
    $("status").textContent = list.data.length === 0
      ? "No collection yet: create one with POST /v1/collections, or normcal ingest."
      : `${list.count} collection${list.count === 1 ? "" : "s"}`;
    document.body.dataset.state = "shown";
  } catch (error) {
    $("status").textContent = "";
    $("error").textContent = String(error.message || error);
    document.body.dataset.state = "error";
  }
}

load();
