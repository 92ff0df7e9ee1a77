// The dashboard's live Plotly chart (app/display.py registers it as a Streamlit v2 component).
//
// Streamlit calls the default export on every rerun with the same parentElement and new
// data: {spec, config, plotly}. One graph div lives in parentElement for the chart's whole
// life and each call hands it to Plotly.react, so a layout.uirevision that does not change
// keeps what the reader did (zoom, pan, runs hidden from the legend) across live refreshes.
// plotly.js is loaded once per page from data.plotly, a URL this server serves.
//
// The look follows st.plotly_chart's "streamlit" theme: the same fonts, colours, grid,
// hover label and bold title, from the app theme's CSS variables, under the figure's own
// layout (which wins where it sets a value). The toolbar also offers what st.plotly_chart's
// did: a camera that downloads in the sidebar's format, and a full-screen view.

let loading = null;

function loadPlotly(url) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!loading) {
    loading = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = () => resolve(window.Plotly);
      script.onerror = () => { loading = null; reject(new Error(`plotly.js did not load from ${url}`)); };
      document.head.appendChild(script);
    });
  }
  return loading;
}

const GRAY = {10: "#fafafa", 30: "#e6eaf1", 70: "#808495", 85: "#31333F", 90: "#262730"};

function isLight(color) {
  const probe = document.createElement("span");
  probe.style.color = color;
  document.body.appendChild(probe);
  const rgb = getComputedStyle(probe).color.match(/[\d.]+/g) || ["255", "255", "255"];
  probe.remove();
  const [r, g, b] = rgb.slice(0, 3).map(Number);
  return 0.299 * r + 0.587 * g + 0.114 * b > 127.5;
}

function themeLayout(element) {
  const css = getComputedStyle(element);
  const v = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
  const bg = v("--st-background-color", "#FFFFFF");
  const light = isLight(bg);
  const text = light ? GRAY[70] : GRAY[30];
  const grid = light ? GRAY[30] : GRAY[85];
  const legend = light ? GRAY[90] : GRAY[10];
  const font = v("--st-font", "sans-serif");
  const rem = parseFloat(v("--st-base-font-size", "16px")) || 16;
  const px = (r) => Math.round(r * rem);
  const [small, medium, large] = [px(0.75), px(0.875), px(1)];
  return {
    font: {color: text, family: font, size: small, weight: 400},
    title: {font: {family: v("--st-heading-font", font), size: large, color: v("--st-heading-color", legend)},
            pad: {l: 4}, xanchor: "left", x: 0},
    legend: {title: {font: {size: small, color: text}, side: "top"}, valign: "top", bordercolor: "rgba(0,0,0,0)",
             borderwidth: 0, font: {size: small, color: legend}},
    paper_bgcolor: bg, plot_bgcolor: bg,
    yaxis: {ticklabelposition: "outside", zerolinecolor: grid, title: {font: {color: text, size: medium}, standoff: 24},
            tickcolor: grid, tickfont: {color: text, size: small}, gridcolor: grid, minor: {gridcolor: grid}, automargin: true},
    xaxis: {zerolinecolor: grid, gridcolor: grid, showgrid: false, tickfont: {color: text, size: small}, tickcolor: grid,
            title: {font: {color: text, size: medium}, standoff: 20}, minor: {gridcolor: grid}, zeroline: false, automargin: true},
    margin: {pad: 8, r: 0, l: 0},
    hoverlabel: {bgcolor: bg, bordercolor: v("--st-border-color", grid), font: {color: text, family: font, size: small}},
  };
}

function merge(target, source) {
  for (const [key, value] of Object.entries(source)) {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      if (!target[key] || typeof target[key] !== "object") target[key] = {};
      merge(target[key], value);
    } else {
      target[key] = value;
    }
  }
  return target;
}

function themed(spec, element) {
  const layout = spec.layout || {};
  const template = layout.template || {};
  template.layout = merge(template.layout || {}, themeLayout(element));
  layout.template = template;
  const title = typeof layout.title === "string" ? {text: layout.title} : layout.title;
  if (title && title.text) layout.title = {...title, text: `<b>${title.text}</b>`};
  return {...spec, layout};
}

// Streamlit's own chart offers a full-screen view from its toolbar; so does this one.
const FULLSCREEN_ICON = {
  width: 600, height: 470, name: "fullscreen",
  path: "M32 32C14.3 32 0 46.3 0 64v96c0 17.7 14.3 32 32 32s32-14.3 32-32V96h64c17.7 0 32-14.3 32-32s-14.3-32-32-32H32zM64 352c0-17.7-14.3-32-32-32s-32 14.3-32 32v96c0 17.7 14.3 32 32 32h96c17.7 0 32-14.3 32-32s-14.3-32-32-32H64V352zM320 32c-17.7 0-32 14.3-32 32s14.3 32 32 32h64v64c0 17.7 14.3 32 32 32s32-14.3 32-32V64c0-17.7-14.3-32-32-32H320zM448 352c0-17.7-14.3-32-32-32s-32 14.3-32 32v64H320c-17.7 0-32 14.3-32 32s14.3 32 32 32h96c17.7 0 32-14.3 32-32V352z",
};

// The buttons are the same objects on every call, and the config handed to Plotly never
// changes: a changed config makes Plotly.react plot afresh and lose the zoom. So the
// camera is this one, which reads the download options (the sidebar's format) when clicked,
// and one full-screen button both enters and leaves full screen.
function buttons(Plotly, gd, box) {
  gd.basisLabButtons ??= {
    download: {name: "Download plot", title: "Download plot", icon: Plotly.Icons.camera,
               click: () => Plotly.downloadImage(gd, gd.basisLab.config.toImageButtonOptions || {})},
    screen: {name: "Fullscreen", title: "Full screen (again to leave)", icon: FULLSCREEN_ICON,
             click: () => (document.fullscreenElement === box ? document.exitFullscreen() : box.requestFullscreen())},
  };
  return gd.basisLabButtons;
}

// Below this width (a phone) the toolbar's row of buttons would cover the chart's title:
// it stands upright in the right margin instead, which is widened to hold it.
const NARROW_PX = 640;
const isNarrow = (box) => box.clientWidth > 0 && box.clientWidth < NARROW_PX;

const TITLE_CHAR_PX = 9;  // about the width of one character of the bold 16 px title
const TITLE_LINE_PX = 20;

// A title longer than the narrow chart is wide is broken into lines at spaces; the chart
// grows by the added lines, and what sits below the title (legend, plot) moves down by as much.
function wrapped(layout, box) {
  const title = layout.title;
  if (!title || !title.text) return layout;
  const perLine = Math.max(12, Math.floor((box.clientWidth - 48) / TITLE_CHAR_PX));
  const lines = [];
  for (const word of title.text.replace(/<\/?b>/g, "").split(" ")) {
    const last = lines.length ? lines[lines.length - 1] : null;
    if (last !== null && (last + " " + word).length <= perLine) lines[lines.length - 1] = last + " " + word;
    else lines.push(word);
  }
  if (lines.length < 2) return layout;
  const extra = (lines.length - 1) * TITLE_LINE_PX;
  const height = layout.height || 450;
  const grown = height + extra;
  const stay = (y) => 1 - ((1 - y) * height) / grown;  // container coordinates, from the top: the same pixels
  const lower = (y) => 1 - ((1 - y) * height + extra) / grown;
  const margin = layout.margin || {};
  const out = {...layout, height: grown, margin: {...margin, t: (margin.t || 0) + extra},
               title: {...title, text: `<b>${lines.join("<br>")}</b>`, ...(title.y != null ? {y: stay(title.y)} : {})}};
  const legend = layout.legend;
  if (legend && legend.yref === "container" && legend.y != null) out.legend = {...legend, y: lower(legend.y)};
  return out;
}

function fitted(layout, box) {
  if (!isNarrow(box)) return layout;
  const margin = layout.margin || {};
  return wrapped({...layout, modebar: {...(layout.modebar || {}), orientation: "v"},
                  margin: {...margin, r: Math.max(margin.r || 0, 36)}}, box);
}

function draw(Plotly, gd, box) {
  const {spec, config} = gd.basisLab;
  const full = document.fullscreenElement === box;
  const layout = fitted(full ? {...spec.layout, height: window.innerHeight} : spec.layout, box);
  const {download, screen} = buttons(Plotly, gd, box);
  const {toImageButtonOptions, ...rest} = config;
  return Plotly.react(gd, spec.data, layout, {
    ...rest, modeBarButtonsToRemove: [...(rest.modeBarButtonsToRemove || []), "toImage"],
    modeBarButtonsToAdd: [download, screen],
  });
}

export default async function ({data, parentElement}) {
  let gd = parentElement.querySelector(":scope > .basis-lab-plot");
  if (!gd) {
    gd = document.createElement("div");
    gd.className = "basis-lab-plot";
    parentElement.appendChild(gd);
  }
  const spec = themed(JSON.parse(data.spec), parentElement);
  gd.style.minHeight = `${spec.layout.height || 450}px`;
  gd.basisLab = {spec, config: data.config};
  const Plotly = await loadPlotly(data.plotly);
  if (gd.basisLab.spec === spec) {  // a newer call has come while plotly.js loaded: it draws, not this one
    await draw(Plotly, gd, parentElement);
  }
  if (!gd.basisLabResize) {  // follow the width of the column (a window resize, the sidebar folded)
    let width = parentElement.clientWidth;
    let narrow = isNarrow(parentElement);
    gd.basisLabResize = new ResizeObserver(() => {
      if (parentElement.clientWidth !== width && gd._fullLayout) {
        width = parentElement.clientWidth;
        if (narrow || isNarrow(parentElement)) {  // the toolbar's side and the title's lines follow: draw again
          narrow = isNarrow(parentElement);
          draw(Plotly, gd, parentElement);
        } else {
          Plotly.Plots.resize(gd);
        }
      }
    });
    gd.basisLabResize.observe(parentElement);
    parentElement.style.background = "var(--st-background-color)";
    parentElement.addEventListener("fullscreenchange", () => draw(Plotly, gd, parentElement));
  }
  // Streamlit keeps the newest call's cleanup, but runs an older call's as soon as that call
  // resolves after a newer one began: only the newest call's may purge the shared plot.
  return () => {
    if (gd.basisLab.spec !== spec) return;
    gd.basisLabResize?.disconnect();
    gd.basisLabResize = null;
    Plotly.purge(gd);
  };
}
