"""What the spawn form (form.py) carries besides its fields: its style sheet and the script
that switches the credit a count lasts, selects an alternative's row and previews a spec."""

#: the form's style sheet
STYLE = """
<style>
.gputap-form fieldset{border:1px solid #ccc;border-radius:6px;margin:0 0 12px;padding:8px 12px}
.gputap-choice{display:block;padding:4px 0;font-weight:normal}
.gputap-out{color:#888}
.gputap-what,.gputap-free,.gputap-lasts{margin-left:10px;color:#555}
.gputap-left{margin-left:10px;font-weight:bold;color:#1a5d1a}
.gputap-price{margin-left:10px;font-weight:bold}
.gputap-soldout{color:#b00;font-weight:bold}
.gputap-sim{background:#fde68a;border-radius:3px;padding:0 4px;font-size:85%}
.gputap-alt{margin-left:26px;color:#555;font-size:90%}
.gputap-pick{margin:2px 4px;padding:1px 8px;border:1px solid #4a7bd0;border-radius:4px;
  background:#eef3fb;color:#1d4ed8;cursor:pointer}
.gputap-short{margin-left:26px;color:#b00;font-size:90%}
.gputap-refusal{background:#fde8e8;border:1px solid #d33;border-radius:6px;padding:8px 12px;
  margin-bottom:10px}
.gputap-refusal p{margin:0 0 4px}
.gputap-refusal .gputap-alt{margin-left:0}
#gputap-course-hours ul{margin:2px 0 10px}
.gputap-banner{background:#fef3c7;border:1px solid #f59e0b;padding:6px 10px;margin-bottom:10px}
.gputap-spec input{width:6em}
#gputap-spec-preview{margin-top:6px;font-style:italic}
</style>
"""

#: the form's script: counts, alternatives' buttons, the spec's live preview
SCRIPT = """
<script>
(function () {
  document.querySelectorAll(".gputap-choice select").forEach(function (select) {
    select.addEventListener("change", function () {
      var row = select.closest(".gputap-choice");
      var lasts = row.querySelector(".gputap-lasts");
      var texts = JSON.parse(lasts.dataset.byCount || "[]");
      if (texts[select.selectedIndex]) lasts.textContent = texts[select.selectedIndex];
      row.querySelector("input[type=radio]").checked = true;
    });
  });

  // an alternative's button selects that option's own row
  document.querySelectorAll(".gputap-pick").forEach(function (button) {
    button.addEventListener("click", function () {
      var radio = document.querySelector(
        'input[name="choice"][value="' + CSS.escape(button.dataset.pick) + '"]');
      if (!radio || radio.disabled) return;
      radio.checked = true;
      radio.dispatchEvent(new Event("change", {bubbles: true}));
      radio.closest(".gputap-choice").scrollIntoView({block: "center"});
      radio.focus();
    });
  });

  var box = document.getElementById("gputap-spec");
  var out = document.getElementById("gputap-spec-preview");
  var timer = null;
  function preview() {
    var q = new URLSearchParams();
    ["min_memory_gb", "min_tflops", "count"].forEach(function (name) {
      q.set(name, box.querySelector("[name=spec_" + name + "]").value || "0");
    });
    out.textContent = "checking…";
    fetch(box.dataset.previewUrl + "?" + q.toString(), {credentials: "same-origin"})
      .then(function (r) { return r.json(); })
      .then(function (answer) { out.textContent = answer.message; })
      .catch(function () { out.textContent = "could not check now"; });
  }
  box.addEventListener("input", function () {
    document.getElementById("gputap-spec-radio").checked = true;
    clearTimeout(timer);
    timer = setTimeout(preview, 250);
  });
  preview();
})();
</script>
"""
