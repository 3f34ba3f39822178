// Keyboard for the review page: each key submits one of the page's forms (marked data-key); the
// forms work without this script. 1-9: candidate N is the same place; p then 1-9 (or Enter for 1):
// partial match; n: none of them; s: skip; u: undo; Esc cancels a pending p.
(function () {
  "use strict";
  var pendingP = false;
  var busy = false;

  function form(key) {
    return document.querySelector('form[data-key="' + key + '"]');
  }

  function showPending(on) {
    pendingP = on;
    var hint = document.getElementById("pending-key");
    if (hint) { hint.hidden = !on; }
    document.body.classList.toggle("pending-partial", on);
  }

  function submit(key) {
    var f = form(key);
    if (!f || busy) { return false; }
    busy = true;  // one decision per page: a held key must not post twice
    document.body.classList.add("busy");
    if (f.requestSubmit) { f.requestSubmit(); } else { f.submit(); }
    return true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) { return; }
    var target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA")) { return; }
    var key = event.key;
    var handled = false;
    if (key === "Escape") {
      showPending(false);
      handled = true;
    } else if (pendingP) {
      if (/^[1-9]$/.test(key)) { handled = submit("p" + key); }
      else if (key === "Enter") { handled = submit("p1"); }
      else if (key !== "Shift") { showPending(false); }
      if (handled) { showPending(false); }
    } else if (/^[1-9]$/.test(key)) {
      handled = submit(key);
    } else if (key === "p" || key === "P") {
      if (form("p1")) { showPending(true); handled = true; }
    } else if (key === "n" || key === "s" || key === "u") {
      handled = submit(key);
    }
    if (handled) { event.preventDefault(); }
  });
})();
