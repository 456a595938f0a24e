// Upload progress for the "Upload new version" form. htmx sends the form with
// XMLHttpRequest and fires htmx:xhr:progress as the body goes out.
(function () {
  function progressFor(elt) {
    var form = elt.closest ? elt.closest("form[data-upload]") : null;
    return form ? form.querySelector(".upload-progress") : null;
  }
  document.addEventListener("htmx:beforeRequest", function (event) {
    var box = progressFor(event.target);
    if (!box) return;
    box.hidden = false;
    box.querySelector("progress").value = 0;
    box.querySelector("[data-progress-text]").textContent = "Uploading… 0%";
  });
  document.addEventListener("htmx:xhr:progress", function (event) {
    var box = progressFor(event.target);
    if (!box || !event.detail.lengthComputable) return;
    var percent = Math.round((event.detail.loaded / event.detail.total) * 100);
    box.querySelector("progress").value = percent;
    box.querySelector("[data-progress-text]").textContent =
      percent < 100 ? "Uploading… " + percent + "%" : "Validating the artifact…";
  });
})();

// The rollout page swaps its progress every second: keep open any "HTTP
// attempts" the reader expanded, by id, across the swap.
(function () {
  var open = [];
  document.addEventListener("htmx:beforeSwap", function (event) {
    open = Array.prototype.map.call(
      event.detail.target.querySelectorAll("details[id][open]"),
      function (d) { return d.id; }
    );
  });
  document.addEventListener("htmx:afterSettle", function () {
    open.forEach(function (id) {
      var details = document.getElementById(id);
      if (details) details.open = true;
    });
    open = [];
  });
})();

// "Copy" beside an example request: copies the text of the element it names.
document.addEventListener("click", function (event) {
  var button = event.target.closest ? event.target.closest("[data-copy]") : null;
  if (!button) return;
  var source = document.getElementById(button.getAttribute("data-copy"));
  if (!source || !navigator.clipboard) return;
  navigator.clipboard.writeText(source.textContent).then(function () {
    button.textContent = "Copied";
    setTimeout(function () { button.textContent = "Copy"; }, 1500);
  });
});
