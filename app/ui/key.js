// normcal pages: the API key and every call to the /v1 API, in one place.
// The key (only when the server sets one) is typed into the page's #key field, kept in
// sessionStorage (this tab only, shared by the pages) and sent as a bearer token. A
// refused call throws an Error whose message is the problem's title and detail.
"use strict";

const normcal = (() => {
  const STORAGE = "normcal-api-key";

  // Fill the page's key field and call onChange after the user types a new key.
  function bindKey(input, onChange) {
    input.value = sessionStorage.getItem(STORAGE) || "";
    input.addEventListener("change", () => {
      sessionStorage.setItem(STORAGE, input.value.trim());
      onChange();
    });
  }

  // fetch() with the key; the Response when it is ok, else an Error with the problem.
  async function request(url, { method = "GET", body, accept = "application/json" } = {}) {
    const headers = { accept };
    const key = sessionStorage.getItem(STORAGE);
    if (key) headers.authorization = `Bearer ${key}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    const response = await fetch(url, {
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
    return response;
  }

  // request() answering the JSON body (null for 204 No Content).
  async function json(url, options) {
    const response = await request(url, options);
    return response.status === 204 ? null : response.json();
  }

  return { bindKey, request, json };
})();
