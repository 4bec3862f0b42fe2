// geoserve's map page: upload a scene, see it in true colour with the model's prediction
// tiles over it (computed on demand for the area in view), run the whole scene.
// Everything comes from this server: no request leaves it unless a basemap is configured.
// The page says what it is doing and what failed: an upload the model cannot use is refused
// with the server's message, tiles being computed are counted, a failed tile's message is
// shown, and below the zoom where tiles are predicted the page says to zoom in.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const map = L.map("map", { zoomControl: true, attributionControl: false }).setView([0, 0], 2);
  const layers = L.control.layers({}, {}, { collapsed: false }).addTo(map);
  L.control.scale({ imperial: false }).addTo(map);
  let config = null, scene = null, input = null, prediction = null;
  const hidden = new Set();  // class codes drawn transparent
  window.geoserveMap = map;  // for scripts driving the page (and its browser test)

  function status(text, failed) {
    $("status").textContent = text;
    $("status").className = failed ? "error" : "";
  }

  // requests that change state carry this header: no other site's form can send it, and the
  // server refuses such requests (with the browser's remembered key) without it
  const PAGE = { "X-Geoserve-Page": "1" };

  async function json(response) {
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.message || response.status + " " + response.statusText);
    return body;
  }

  async function start() {
    config = await json(await fetch("ui/config.json"));
    $("model").textContent = config.model;
    if (config.basemap_url) {
      const base = L.tileLayer(config.basemap_url, { maxZoom: 22 }).addTo(map);
      layers.addBaseLayer(base, "Basemap");
    }
    config.transparent.forEach((i) => hidden.add(i));
    config.classes.forEach((name, i) => $("legend").append(legendRow(name, i)));
    const [lo, hi] = config.confidence_range;
    $("ramp-bar").style.background = "linear-gradient(to right, " + config.ramp.join(", ") + ")";
    $("ramp-low").textContent = Math.round(lo * 100) + " %";
    $("ramp-high").textContent = Math.round(hi * 100) + " %";
    if (!config.uploads) {
      $("file").disabled = true;
      status("Uploads are off on this server (it was started without --output-dir).", true);
    }
  }

  function legendRow(name, i) {
    const row = document.createElement("label");
    row.className = "row";
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = !hidden.has(i);
    box.title = "draw " + name;
    box.addEventListener("change", () => {
      if (box.checked) hidden.delete(i); else hidden.add(i);
      if (scene) showPrediction();
    });
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = "rgb(" + config.colors[i].join(",") + ")";
    const label = document.createElement("span");
    label.textContent = name;
    row.append(box, swatch, label);
    return row;
  }

  function tiles(kind, minZoom) {
    let url = "v1/tiles/{z}/{x}/{y}.png?source=" + encodeURIComponent(scene.id) + "&kind=" + kind;
    if (kind === "classes" && hidden.size) url += "&hide=" + [...hidden].join(",");
    return L.tileLayer(url, { minZoom: minZoom, maxZoom: 22, maxNativeZoom: scene.maxzoom, tileSize: 256 });
  }

  // the zoom from which the prediction is drawn: stored classes after a whole-scene run come
  // at every zoom; confidence, and classes before, only where tiles are predicted on demand
  function predictionZoom() {
    return scene.predicted && $("kind").value === "classes" ? 0 : scene.minzoom;
  }

  // a failed tile's message: its URL fetched once more, the server's JSON message read
  async function explain(src) {
    try {
      const response = await fetch(src);
      if (response.ok) return "a tile failed to load; pan or zoom to retry";
      const body = await response.json().catch(() => ({}));
      return body.message || response.status + " " + response.statusText;
    } catch (err) { return err.message; }
  }

  function report(layer) {
    if (layer !== prediction || zoomed()) return;
    const c = layer.counts, what = $("kind").value === "classes" ? "Prediction" : "Confidence";
    if (c.failed) {
      const message = layer.failure || "…";
      status(what + " failed for " + scene.name + " (" + c.failed + " of " + c.started +
        " tiles): " + message, true);
    } else if (c.done < c.started) {
      status("Predicting tiles for " + scene.name + ": " + c.done + " of " + c.started +
        " done, " + (c.started - c.done) + " pending (zoom " + map.getZoom() + ")…");
    } else {
      status("Prediction tiles shown for " + scene.name + " (zoom " + map.getZoom() + ").");
    }
  }

  function watch(layer) {
    layer.counts = { started: 0, done: 0, failed: 0 };
    layer.on("loading", () => { layer.counts = { started: 0, done: 0, failed: 0 }; });
    layer.on("tileloadstart", () => { layer.counts.started++; report(layer); });
    layer.on("tileabort", () => { layer.counts.started--; report(layer); });
    layer.on("tileload", () => { layer.counts.done++; report(layer); });
    layer.on("tileerror", async (e) => {
      layer.counts.failed++;
      layer.counts.done++;
      if (!layer.asked) {  // one tile's message, fetched once
        layer.asked = true;
        layer.failure = await explain(e.tile.src);
      }
      report(layer);
    });
    return layer;
  }

  // below the prediction's zoom no tile is asked for: say so, and how to see it (true when so)
  function zoomed() {
    if (!scene || !prediction || !map.hasLayer(prediction)) return false;
    const z = predictionZoom();
    if (map.getZoom() >= z) return false;
    const more = $("kind").value === "classes" ? ", or Run the whole scene" : "";
    status(scene.name + ": the prediction is drawn from zoom " + z + " (now " + map.getZoom() +
      "): zoom in to " + z + more + ".");
    return true;
  }

  function showPrediction() {
    const shown = !prediction || map.hasLayer(prediction);
    if (prediction) { layers.removeLayer(prediction); map.removeLayer(prediction); }
    const kind = $("kind").value;
    prediction = watch(tiles(kind, predictionZoom()));
    prediction.setOpacity($("opacity").value / 100);
    layers.addOverlay(prediction, kind === "classes" ? "Prediction" : "Confidence");
    if (shown) prediction.addTo(map);
    $("legend").hidden = kind !== "classes";
    $("ramp").hidden = kind === "classes";
    zoomed();
  }

  $("file").addEventListener("change", async () => {
    const file = $("file").files[0];
    if (!file) return;
    status("Uploading " + file.name + "…");
    const form = new FormData();
    form.append("file", file, file.name);
    try {
      scene = await json(await fetch("v1/scenes", { method: "POST", body: form, headers: PAGE }));
    } catch (err) { status("Upload of " + file.name + " failed: " + err.message, true); return; }
    scene.name = file.name;
    if (input) { layers.removeLayer(input); map.removeLayer(input); }
    input = tiles("input", Math.max(0, scene.minzoom - 2)).addTo(map);
    layers.addOverlay(input, "Scene (true colour)");
    const [w, s, e, n] = scene.bounds;
    map.fitBounds([[s, w], [n, e]]);
    if (map.getZoom() < scene.minzoom) map.setZoom(scene.minzoom);
    status(file.name + ": predictions from zoom " + scene.minzoom + ".");
    showPrediction();
    $("run").disabled = false;
    $("download").hidden = true;
  });

  map.on("zoomend", zoomed);
  $("opacity").addEventListener("input", () => prediction && prediction.setOpacity($("opacity").value / 100));
  $("kind").addEventListener("change", () => scene && showPrediction());

  $("run").addEventListener("click", async () => {
    $("run").disabled = true;
    status("Running the whole of " + scene.name + "…");
    try {
      const done = await json(await fetch("v1/scenes/" + scene.id + "/predict", { method: "POST", headers: PAGE }));
      scene.predicted = true;
      $("download").href = done.download;
      $("download").download = scene.name.replace(/\.[^.]*$/, "") + "_classes.tif";
      $("download").hidden = false;
      showPrediction();
      status(scene.name + ": the whole scene done in " + done.seconds.toFixed(1) + " s.");
    } catch (err) { status("Run failed for " + scene.name + ": " + err.message, true); }
    $("run").disabled = false;
  });

  start().catch((err) => status("Could not start: " + err.message, true));
})();
