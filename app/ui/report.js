// normcal report viewer: the calibration report of /v1/.../calibrators/{id}/report,
// fetched with the API key the judging page keeps in sessionStorage (a plain link
// cannot send it). The server renders the page with every value escaped; it is shown
// here as parsed DOM (no script of it runs: the CSP allows none inline), and its
// diagram is fetched with the key too and shown from a blob: URL.
"use strict";

const KEY_STORAGE = "normcal-api-key";
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
const keyInput = $("key");
keyInput.value = sessionStorage.getItem(KEY_STORAGE) || "";
keyInput.addEventListener("change", () => {
  sessionStorage.setItem(KEY_STORAGE, keyInput.value.trim());
  load();
});

async function get(url, accept) {
  const headers = { accept };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.authorization = `Bearer ${key}`;
  const response = await fetch(url, { headers });
  if (!response.ok) {
    let detail = `${response.status} ${response.statusText}`;
    try {
      const problem = await response.json();
      detail = `${problem.title}: ${problem.detail}`;
    } catch (_) { /* not a problem document */ }
    throw new Error(detail);
  }
  return response;
}

async function load() {
  document.body.dataset.state = "loading";
  $("error").textContent = "";
  try {
    const page = await (await get(reportUrl, "text/html")).text();
    const doc = new DOMParser().parseFromString(page, "text/html");
    const image = doc.getElementById("reliability");
    const png = image && new URL(image.getAttribute("src"), reportUrl);
    if (image) image.removeAttribute("src"); // relative to the report, not to here
    document.title = doc.title;
    $("report").replaceChildren(...doc.body.childNodes);
    if (png) {
      const blob = await (await get(png, "image/png")).blob();
      image.src = URL.createObjectURL(blob);
    }
    document.body.dataset.state = "shown";
  } catch (error) {
    $("error").textContent = String(error.message || error);
    document.body.dataset.state = "error";
  }
}

load();
