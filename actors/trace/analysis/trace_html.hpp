// `dsactor trace RUN html FILE`: one self-contained HTML page (no network: the
// script and style are inline) with a zoomable timeline of a run's traces — a
// lane per (rank, actor), the NVMe swap's I/O spans on a lane of their own,
// spans as boxes, each message as an arrow from its send to its receipt; mouse
// wheel zooms, dragging pans, double-click fits — followed by the text of
// `summary` and `check`. The page's script marks #render-status with
// data-status="ok" once it drew the timeline without an exception, and a
// window.onerror handler writes any script error into #render-errors (the test
// reads both from Chromium's --dump-dom). Opened as page.html#selftest, the
// script first drives its own zoom, pan, hover and fit handlers with synthetic
// events and throws if the view did not follow.
#pragma once

#include "actors/trace/analysis/trace_summary.hpp"
#include "core/error.hpp"

#include <string>
#include <vector>

namespace dsa::actors {

// `title` heads the page (the run's path, say).
std::string trace_html_page(const std::vector<rank_trace>& traces, const std::string& title);
status write_trace_html(const std::string& path, const std::vector<rank_trace>& traces, const std::string& title);

// The page's inline script and style (trace_html_assets.cpp).
extern const char* const trace_html_script;
extern const char* const trace_html_style;

} // namespace dsa::actors
