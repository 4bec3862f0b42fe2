// geoserve's map page: upload a scene, see it in true colour with the model's prediction
// tiles over it (computed on demand for the area in view), run the whole scene.
// Everything comes from this server: no request leaves it unless a basemap is configured.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const map = L.map("map", { zoomControl: true, attributionControl: false }).setView([0, 0], 2);
  let config = null, scene = null, input = null, prediction = null;
  window.geoserveMap = map;  // for scripts driving the page (and its browser test)

  function status(text) { $("status").textContent = text; }

  // requests that change state carry this header: no other site's form can send it, and the
  // server refuses such requests (with the browser's remembered key) without it
  const PAGE = { "X-Geoserve-Page": "1" };

  async function json(response) {
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.message || response.statusText);
    return body;
  }

  async function start() {
    config = await json(await fetch("ui/config.json"));
    $("model").textContent = config.model;
    if (config.basemap_url) L.tileLayer(config.basemap_url, { maxZoom: 22 }).addTo(map);
    const legend = $("legend");
    config.classes.forEach((name, i) => {
      const row = document.createElement("div");
      row.className = "row";
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = "rgb(" + config.colors[i].join(",") + ")";
      const label = document.createElement("span");
      label.textContent = name;
      row.append(swatch, label);
      legend.append(row);
    });
  }

  function tiles(kind, minZoom) {
    const url = "v1/tiles/{z}/{x}/{y}.png?source=" + encodeURIComponent(scene.id) + "&kind=" + kind;
    return L.tileLayer(url, { minZoom: minZoom, maxZoom: 22, maxNativeZoom: scene.maxzoom, tileSize: 256 });
  }

  function showPrediction(minZoom) {
    if (prediction) map.removeLayer(prediction);
    prediction = tiles($("kind").value, minZoom);
    prediction.setOpacity($("opacity").value / 100);
    prediction.on("load", () => status("Prediction tiles shown (zoom " + map.getZoom() + ")."));
    prediction.addTo(map);
  }

  $("file").addEventListener("change", async () => {
    const file = $("file").files[0];
    if (!file) return;
    status("Uploading " + file.name + "…");
    const form = new FormData();
    form.append("file", file, file.name);
    try {
      scene = await json(await fetch("v1/scenes", { method: "POST", body: form, headers: PAGE }));
    } catch (err) { status("Upload failed: " + err.message); return; }
    if (input) map.removeLayer(input);
    input = tiles("input", Math.max(0, scene.minzoom - 2)).addTo(map);
    const [w, s, e, n] = scene.bounds;
    map.fitBounds([[s, w], [n, e]]);
    if (map.getZoom() < scene.minzoom) map.setZoom(scene.minzoom);
    showPrediction(scene.minzoom);
    $("run").disabled = false;
    $("download").hidden = true;
    status("Scene " + scene.id + ": predictions from zoom " + scene.minzoom + ".");
  });

  $("opacity").addEventListener("input", () => prediction && prediction.setOpacity($("opacity").value / 100));
  $("kind").addEventListener("change", () => scene && showPrediction(scene.predicted ? 0 : scene.minzoom));

  $("run").addEventListener("click", async () => {
    $("run").disabled = true;
    status("Running the whole scene…");
    try {
      const done = await json(await fetch("v1/scenes/" + scene.id + "/predict", { method: "POST", headers: PAGE }));
      scene.predicted = true;
      $("download").href = done.download;
      $("download").download = scene.id + "_classes.tif";
      $("download").hidden = false;
      showPrediction(0);
      status("Whole scene done in " + done.seconds.toFixed(1) + " s.");
    } catch (err) { status("Run failed: " + err.message); }
    $("run").disabled = false;
  });

  start().catch((err) => status("Could not start: " + err.message));
})();
