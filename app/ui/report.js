// normcal report viewer: the calibration report of /v1/.../calibrators/{id}/report,
// fetched with the API key the pages keep (key.js; a plain link cannot send it). The
// server renders the page with every value escaped; it is shown here as parsed DOM
// (no script of it runs: the CSP allows none inline), and its diagram is fetched with
// the key too and shown from a blob: URL.
"use strict";

// This page is /ui/collections/{c}/calibrators/{id}/report.
const parts = location.pathname.split("/");
const calibrator = decodeURIComponent(parts[parts.length - 2]);
const collection = decodeURIComponent(parts[parts.length - 4]);
const root = new URL("../../../../../", location.href);
const reportUrl = new URL(
  `v1/collections/${encodeURIComponent(collection)}/calibrators/` +
    `${encodeURIComponent(calibrator)}/report`,
  root,
);

const $ = (id) => document.getElementById(id);
normcal.bindKey($("key"), load);

async function load() {
  document.body.dataset.state = "loading";
  $("error").textContent = "";
  try {
    const page = await (await normcal.request(reportUrl, { accept: "text/html" })).text();
    const doc = new DOMParser().parseFromString(page, "text/html");
    const image = doc.getElementById("reliability");
    const png = image && new URL(image.getAttribute("src"), reportUrl);
    if (image) image.removeAttribute("src"); // relative to the report, not to here
    document.title = doc.title;
    $("report").replaceChildren(...doc.body.childNodes);
    if (png) {
      const blob = await (await normcal.request(png, { accept: "image/png" })).blob();
      image.src = URL.createObjectURL(blob);
    }
    document.body.dataset.state = "shown";
  } catch (error) {
    $("error").textContent = String(error.message || error);
    document.body.dataset.state = "error";
  }
}

load();
