// The SVG chart kit of `shardlm report` (report/report.h): number formatting, axes with ticks,
// legends, line charts and stacked bar charts, drawn as inline SVG with no script or library. Kept
// apart from the report's charts, which say what to draw from a run, and from the run loader.
#pragma once
#include <cmath>
#include <cstddef>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace shardlm::observe::svg {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr int kWidth = 560;
inline constexpr int kHeight = 310;
inline constexpr int kMarginLeft = 70, kMarginRight = 18, kMarginBottom = 46;
inline constexpr size_t kMaxLinePoints = 2000;  // longer series are drawn as means of consecutive steps
inline constexpr size_t kMaxBars = 200;         // likewise for per-step bars

inline const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
inline const char* const kSkipColor = "#d62728";

// Text escaped for HTML; a number with `significant` digits ("–" when not finite); a pixel
// coordinate; bytes and seconds as util/units.h prints them; 12345.6 as "12,346".
std::string esc(const std::string& s);
std::string num(double v, int significant = 4);
std::string px(double v);
std::string bytes_label(double b);
std::string seconds_label(double s);
std::string thousands(double v);
// Over the finite values only (NaN when there are none).
double finite_mean(const std::vector<double>& v, size_t from = 0);
double finite_max(const std::vector<double>& v);
double finite_sum(const std::vector<double>& v);
double last_finite(const std::vector<double>& v);

struct AxisSpec {
  std::string title;
  bool log = false;
  double base = 10;                               // log axes: ticks at powers of base
  bool integer = false;                           // ticks at whole numbers (steps)
  bool zero_based = false;                        // the range includes 0
  bool binary = false;                            // linear ticks at round multiples of KiB/MiB/GiB
  std::function<std::string(double)> label = [](double v) { return num(v); };
  std::function<std::string(double)> tooltip = [](double v) { return num(v, 6); };  // a point's exact value
};

struct Ticks {
  double lo = 0, hi = 1;  // domain (exponents for log axes)
  std::vector<double> at; // tick positions in domain units
};
Ticks make_ticks(double lo, double hi, const AxisSpec& a);

struct LegendItem {
  std::string name, color;
  std::string style = "line";  // line | dash | marker | skip | box | hollow
};
// Legend items laid out in rows under the title; returns the markup and sets `bottom` to the y below it.
std::string legend_svg(const std::vector<LegendItem>& items, double& bottom);
std::string svg_open(const std::string& id, const std::string& title, int height = kHeight);
// A chart with no data: the title and why there is nothing to draw.
std::string empty_chart(const std::string& id, const std::string& title, const std::string& why);

struct Plot {
  double left, right, top, bottom;
  Ticks xt, yt;
  AxisSpec xa, ya;
  double x(double v) const { return left + (dom(v, xa) - xt.lo) / (xt.hi - xt.lo) * (right - left); }
  double y(double v) const { return bottom - (dom(v, ya) - yt.lo) / (yt.hi - yt.lo) * (bottom - top); }
  static double dom(double v, const AxisSpec& a) { return a.log ? std::log(v) / std::log(a.base) : v; }
  double tick_value(double t, const AxisSpec& a) const { return a.log ? std::pow(a.base, t) : t; }

  std::string axes() const {
    std::ostringstream o;
    o << "<rect class=\"plot-area\" x=\"" << px(left) << "\" y=\"" << px(top) << "\" width=\"" << px(right - left)
      << "\" height=\"" << px(bottom - top) << "\"/>";
    o << "<g class=\"axis y-axis\">";
    for (double t : yt.at) {
      const double yy = bottom - (t - yt.lo) / (yt.hi - yt.lo) * (bottom - top);
      o << "<line class=\"grid\" x1=\"" << px(left) << "\" x2=\"" << px(right) << "\" y1=\"" << px(yy) << "\" y2=\""
        << px(yy) << "\"/><text x=\"" << px(left - 6) << "\" y=\"" << px(yy + 4) << "\" text-anchor=\"end\">"
        << esc(ya.label(tick_value(t, ya))) << "</text>";
    }
    o << "<text class=\"axis-title\" transform=\"translate(14," << px((top + bottom) / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">" << esc(ya.title) << "</text></g>";
    o << "<g class=\"axis x-axis\">";
    for (double t : xt.at) {
      const double xx = left + (t - xt.lo) / (xt.hi - xt.lo) * (right - left);
      o << "<line class=\"tick\" x1=\"" << px(xx) << "\" x2=\"" << px(xx) << "\" y1=\"" << px(bottom) << "\" y2=\""
        << px(bottom + 5) << "\"/><text x=\"" << px(xx) << "\" y=\"" << px(bottom + 18) << "\" text-anchor=\"middle\">"
        << esc(xa.label(tick_value(t, xa))) << "</text>";
    }
    o << "<text class=\"axis-title\" x=\"" << px((left + right) / 2) << "\" y=\"" << px(bottom + 36)
      << "\" text-anchor=\"middle\">" << esc(xa.title) << "</text></g>";
    return o.str();
  }
};

struct Series {
  std::string name, color;
  std::vector<double> x, y;
  // line | dash | marker (dots) | line+marker | skip (triangles on the x axis at x; y unused)
  std::string style = "line";
  bool legend = true;
};
std::string line_chart(const std::string& id, const std::string& title, std::vector<Series> series, const AxisSpec& xa,
                       const AxisSpec& ya, const std::string& empty_why, std::vector<LegendItem> extra_legend = {});

struct Category {
  std::string name, color;
};

struct Stack {
  std::string label;            // under the bar
  std::vector<double> values;   // one per category; NaN or 0 draws nothing
  std::string top_label = {};   // above the bar
  double marker = kNaN;         // a dashed line across the bar at this value (e.g. a planned total)
  std::string marker_label = {};
  std::string placeholder = {}; // no bar: this text in its place, saying why
  std::string axis_label = {};  // under the bar when shorter than `label`

};
std::string stacked_bar_chart(const std::string& id, const std::string& title, const std::vector<Category>& cats,
                              const std::vector<Stack>& stacks, const AxisSpec& ya, const std::string& x_title,
                              std::vector<LegendItem> extra_legend, const std::string& caption);

}  // namespace shardlm::observe::svg
