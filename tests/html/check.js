// Appended to a `decode --html` report by tests/decode_teach.rs and run in headless
// Chromium: checks the DOM the page built, clicks a frame and a field, applies a filter,
// and leaves its findings as JSON in <pre id="check-result"> for the test to read.
(function () {
  const r = { errors: [] };
  const fail = m => r.errors.push(String(m));
  window.addEventListener("error", e => fail(e.message));
  try {
    r.total_frames = F.length;
    r.render_ms = +document.body.getAttribute("data-render-ms");
    r.diagrams = document.querySelectorAll("svg.ladder").length;
    r.arrows = document.querySelectorAll("svg.ladder g.f").length;
    r.sections = document.querySelectorAll("div.conn").length;
    if (r.sections !== r.diagrams) fail(`${r.sections} sections for ${r.diagrams} diagrams`);
    const click = e => e.dispatchEvent(new MouseEvent("click", { bubbles: true }));
    // A READ request if there is one, else the first frame.
    let g = [...document.querySelectorAll("svg.ladder g.f")].find(x => /READ_REQUEST/.test(x.textContent))
      || document.querySelector("svg.ladder g.f");
    click(g.querySelector("line"));
    const title = document.querySelector("#detail h2").textContent;
    r.clicked_title_has_read = /READ_REQUEST/.test(title);
    r.field_cells = document.querySelectorAll("#detail table.bits td[data-k]").length;
    r.field_rows = document.querySelectorAll("#detail table.flist tr").length;
    r.selected = document.querySelectorAll("g.f.sel").length;
    if (r.selected !== 1) fail(`${r.selected} frames selected after a click`);
    const cells = [...document.querySelectorAll("#detail table.bits td[data-k]")];
    const cell = cells.find(td => /^DMALen /.test(td.getAttribute("title") || ""))
      || cells.find(td => /^PSN /.test(td.getAttribute("title") || ""));
    if (cell) {
      click(cell);
      r.highlighted_bytes = document.querySelectorAll("#hex span.on").length;
      r.meaning = document.getElementById("meaning").textContent;
    } else fail("no DMALen or PSN cell");
    // Filter: only READ requests (opcode 0x0c), then back to all.
    const sel = document.getElementById("fop");
    sel.value = "12";
    sel.dispatchEvent(new Event("change"));
    r.filtered_arrows = document.querySelectorAll("svg.ladder g.f").length;
    sel.value = "-1";
    sel.dispatchEvent(new Event("change"));
    if (document.querySelectorAll("svg.ladder g.f").length !== r.arrows) fail("the filter did not reset");
    // Leave the READ selected for the screenshot.
    g = [...document.querySelectorAll("svg.ladder g.f")].find(x => /READ_REQUEST/.test(x.textContent));
    if (g) click(g.querySelector("line"));
  } catch (e) {
    fail(e && e.stack || e);
  }
  const pre = document.createElement("pre");
  pre.id = "check-result";
  pre.style.display = "none";
  pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
})();
