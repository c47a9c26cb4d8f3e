// See svg_chart.h.
#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <sstream>

#include "util/units.h"

namespace shardlm::observe::svg {

// ---- formatting ----------------------------------------------------------------------------------

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, int significant) {
  if (!std::isfinite(v)) return "–";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*g", significant, v);
  return buf;
}

// Pixel coordinates: one decimal is plenty.
std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string bytes_label(double b) { return std::isfinite(b) ? util::format_bytes(b) : "–"; }

std::string seconds_label(double s) { return std::isfinite(s) ? util::format_duration(s) : "–"; }

// 12345.6 -> "12,346"
std::string thousands(double v) {
  if (!std::isfinite(v)) return "–";
  const long long n = std::llround(v);
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return (n < 0 ? "-" : "") + out;
}

double finite_mean(const std::vector<double>& v, size_t from) {
  double s = 0;
  size_t n = 0;
  for (size_t i = from; i < v.size(); ++i)
    if (std::isfinite(v[i])) s += v[i], ++n;
  return n ? s / n : kNaN;
}

double finite_max(const std::vector<double>& v) {
  double m = kNaN;
  for (double x : v)
    if (std::isfinite(x) && !(x <= m)) m = x;
  return m;
}

double finite_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v)
    if (std::isfinite(x)) s += x;
  return s;
}

double last_finite(const std::vector<double>& v) {
  for (auto it = v.rbegin(); it != v.rend(); ++it)
    if (std::isfinite(*it)) return *it;
  return kNaN;
}

// ---- chart geometry ------------------------------------------------------------------------------







namespace {

double nice_step(double raw) {
  const double e = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / e;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * e;
}

}  // namespace

Ticks make_ticks(double lo, double hi, const AxisSpec& a) {
  Ticks t;
  if (a.log) {
    const double lb = std::log(a.base);
    t.lo = std::floor(std::log(lo) / lb + 1e-9);
    t.hi = std::ceil(std::log(hi) / lb - 1e-9);
    if (t.hi <= t.lo) t.lo -= 1, t.hi += 1;
    const double every = std::max(1.0, std::ceil((t.hi - t.lo) / 8));
    t.hi = t.lo + std::ceil((t.hi - t.lo) / every) * every;
    for (double e = t.lo; e <= t.hi + 1e-9; e += every) t.at.push_back(e);
    return t;
  }
  if (a.zero_based) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  if (hi - lo <= 0) {
    const double pad = lo != 0 ? std::fabs(lo) * 0.1 : 1.0;
    lo -= pad, hi += pad;
    if (a.zero_based && lo < 0 && hi > 0 && (lo + pad) >= 0) lo = 0;
  }
  double step = nice_step((hi - lo) / 5);
  if (a.binary) {
    const double unit = std::pow(1024.0, std::floor(std::log(std::max(std::fabs(hi), 1.0)) / std::log(1024.0)));
    step = nice_step((hi - lo) / unit / 5) * unit;
  }
  if (a.integer) step = std::max(1.0, std::round(step));
  t.lo = std::floor(lo / step + 1e-9) * step;
  t.hi = std::ceil(hi / step - 1e-9) * step;
  if (t.hi <= t.lo) t.hi = t.lo + step;
  for (double v = t.lo; v <= t.hi + step * 1e-6; v += step) t.at.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}



// Legend items laid out in rows under the title; returns the markup and sets `bottom` to the y below it.
std::string legend_svg(const std::vector<LegendItem>& items, double& bottom) {
  std::ostringstream o;
  double x = kMarginLeft, y = 40;
  o << "<g class=\"legend\">";
  for (const auto& it : items) {
    const double w = 26 + 6.3 * it.name.size() + 16;
    if (x + w > kWidth - kMarginRight && x > kMarginLeft) x = kMarginLeft, y += 17;
    o << "<g class=\"legend-item\">";
    if (it.style == "line" || it.style == "dash")
      o << "<line x1=\"" << px(x) << "\" y1=\"" << px(y - 4) << "\" x2=\"" << px(x + 20) << "\" y2=\"" << px(y - 4)
        << "\" stroke=\"" << it.color << "\" stroke-width=\"2\"" << (it.style == "dash" ? " stroke-dasharray=\"5 3\"" : "")
        << "/>";
    else if (it.style == "marker")
      o << "<circle cx=\"" << px(x + 10) << "\" cy=\"" << px(y - 4) << "\" r=\"3.5\" fill=\"" << it.color << "\"/>";
    else if (it.style == "skip")
      o << "<path d=\"M" << px(x + 10) << " " << px(y - 9) << "l4.5 9h-9z\" fill=\"" << it.color << "\"/>";
    else if (it.style == "hollow")
      o << "<rect x=\"" << px(x + 3) << "\" y=\"" << px(y - 10) << "\" width=\"14\" height=\"11\" fill=\"none\" stroke=\""
        << it.color << "\" stroke-width=\"1.5\" stroke-dasharray=\"3 2\"/>";
    else
      o << "<rect x=\"" << px(x + 3) << "\" y=\"" << px(y - 10) << "\" width=\"14\" height=\"11\" fill=\"" << it.color << "\"/>";
    o << "<text x=\"" << px(x + 26) << "\" y=\"" << px(y) << "\">" << esc(it.name) << "</text></g>";
    x += w;
  }
  o << "</g>";
  bottom = y + 12;
  return o.str();
}

std::string svg_open(const std::string& id, const std::string& title, int height) {
  std::ostringstream o;
  o << "<svg class=\"chart\" id=\"" << id << "\" width=\"" << kWidth << "\" height=\"" << height << "\" viewBox=\"0 0 "
    << kWidth << " " << height << "\" role=\"img\" aria-label=\"" << esc(title) << "\">"
    << "<text class=\"title\" x=\"" << kMarginLeft << "\" y=\"20\">" << esc(title) << "</text>";
  return o.str();
}

// A chart that has nothing to draw says why, in place of the plot.
std::string empty_chart(const std::string& id, const std::string& title, const std::string& why) {
  std::ostringstream o;
  o << svg_open(id, title, 120) << "<rect class=\"plot-area\" x=\"" << kMarginLeft << "\" y=\"34\" width=\""
    << kWidth - kMarginLeft - kMarginRight << "\" height=\"60\"/>"
    << "<text class=\"no-data\" x=\"" << kWidth / 2 << "\" y=\"69\" text-anchor=\"middle\">" << esc(why) << "</text></svg>";
  return o.str();
}



// ---- line charts ---------------------------------------------------------------------------------



namespace {

// Means of consecutive points so at most `limit` remain; NaN stays a gap when a whole bin is NaN.
size_t bin_series(std::vector<double>& x, std::vector<double>& y, size_t limit) {
  if (x.size() <= limit) return 1;
  const size_t k = (x.size() + limit - 1) / limit;
  std::vector<double> bx, by;
  for (size_t i = 0; i < x.size(); i += k) {
    double sx = 0, sy = 0;
    size_t nx = 0, ny = 0;
    for (size_t j = i; j < std::min(x.size(), i + k); ++j) {
      sx += x[j], ++nx;
      if (std::isfinite(y[j])) sy += y[j], ++ny;
    }
    bx.push_back(sx / nx);
    by.push_back(ny ? sy / ny : kNaN);
  }
  x.swap(bx);
  y.swap(by);
  return k;
}

}  // namespace

namespace {

bool usable(double v, const AxisSpec& a) { return std::isfinite(v) && (!a.log || v > 0); }

}  // namespace

std::string line_chart(const std::string& id, const std::string& title, std::vector<Series> series, const AxisSpec& xa,
                       const AxisSpec& ya, const std::string& empty_why, std::vector<LegendItem> extra_legend) {
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  size_t drawn = 0, binned = 1;
  for (auto& s : series) {
    if (s.style != "skip" && s.style != "marker") binned = std::max(binned, bin_series(s.x, s.y, kMaxLinePoints));
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (s.style == "skip") {
        if (std::isfinite(s.x[i])) xlo = std::min(xlo, s.x[i]), xhi = std::max(xhi, s.x[i]);
        continue;
      }
      if (!std::isfinite(s.x[i]) || !usable(s.y[i], ya)) continue;
      xlo = std::min(xlo, s.x[i]), xhi = std::max(xhi, s.x[i]);
      ylo = std::min(ylo, s.y[i]), yhi = std::max(yhi, s.y[i]);
      ++drawn;
    }
  }
  if (drawn == 0) return empty_chart(id, title, empty_why);

  std::vector<LegendItem> legend;
  for (const auto& s : series)
    if (s.legend) legend.push_back({s.name, s.color, s.style == "line+marker" ? "marker" : s.style});
  for (auto& e : extra_legend) legend.push_back(e);
  double legend_bottom = 0;
  const std::string legend_markup = legend_svg(legend, legend_bottom);

  Plot p{kMarginLeft, kWidth - kMarginRight, legend_bottom + 6, kHeight - kMarginBottom, {}, {}, xa, ya};
  p.xt = make_ticks(xlo, xhi, xa);
  p.yt = make_ticks(ylo, yhi, ya);

  std::ostringstream o;
  o << svg_open(id, title) << legend_markup << p.axes();
  o << "<defs><clipPath id=\"clip-" << id << "\"><rect x=\"" << px(p.left) << "\" y=\"" << px(p.top - 4) << "\" width=\""
    << px(p.right - p.left) << "\" height=\"" << px(p.bottom - p.top + 8) << "\"/></clipPath></defs>";
  o << "<g clip-path=\"url(#clip-" << id << ")\">";
  for (const auto& s : series) {
    size_t n = 0;
    if (s.style == "skip") {
      std::ostringstream d;
      for (double xv : s.x)
        if (std::isfinite(xv)) d << "M" << px(p.x(xv)) << " " << px(p.bottom - 9) << "l4.5 9h-9z", ++n;
      o << "<path class=\"series skip-markers\" data-name=\"" << esc(s.name) << "\" data-points=\"" << n << "\" d=\""
        << d.str() << "\" fill=\"" << s.color << "\"/>";
      continue;
    }
    if (s.style != "marker") {
      std::ostringstream d;
      bool pen = false;
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !usable(s.y[i], ya)) {
          pen = false;
          continue;
        }
        d << (pen ? "L" : "M") << px(p.x(s.x[i])) << " " << px(p.y(s.y[i]));
        pen = true;
        ++n;
      }
      o << "<path class=\"series line\" data-name=\"" << esc(s.name) << "\" data-points=\"" << n << "\" d=\"" << d.str()
        << "\" fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"" << (s.style == "dash" ? 1.4 : 1.8) << "\""
        << (s.style == "dash" ? " stroke-dasharray=\"5 3\"" : "") << "/>";
    }
    if (s.style == "marker" || s.style == "line+marker") {
      n = 0;
      std::ostringstream g;
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !usable(s.y[i], ya)) continue;
        g << "<circle cx=\"" << px(p.x(s.x[i])) << "\" cy=\"" << px(p.y(s.y[i])) << "\" r=\"3.2\"><title>step "
          << num(s.x[i], 10) << ": " << esc(ya.tooltip(s.y[i])) << "</title></circle>";
        ++n;
      }
      o << "<g class=\"series markers\" data-name=\"" << esc(s.name) << "\" data-points=\"" << n << "\" fill=\"" << s.color
        << "\">" << g.str() << "</g>";
    }
  }
  o << "</g>";
  if (binned > 1)
    o << "<text class=\"caption\" x=\"" << px(p.right) << "\" y=\"" << px(p.bottom + 36) << "\" text-anchor=\"end\">lines: mean of "
      << binned << " steps per point</text>";
  o << "</svg>";
  return o.str();
}

// ---- stacked bar charts --------------------------------------------------------------------------





std::string stacked_bar_chart(const std::string& id, const std::string& title, const std::vector<Category>& cats,
                              const std::vector<Stack>& stacks, const AxisSpec& ya, const std::string& x_title,
                              std::vector<LegendItem> extra_legend, const std::string& caption) {
  double yhi = 0;
  size_t drawn = 0;
  for (const auto& s : stacks) {
    double sum = 0;
    for (double v : s.values)
      if (std::isfinite(v) && v > 0) sum += v, ++drawn;
    yhi = std::max({yhi, sum, std::isfinite(s.marker) ? s.marker : 0.0});
  }
  if (drawn == 0) return empty_chart(id, title, "nothing to draw: every value is zero or missing");
  std::vector<LegendItem> legend;
  for (const auto& c : cats) legend.push_back({c.name, c.color, "box"});
  for (auto& e : extra_legend) legend.push_back(e);
  double legend_bottom = 0;
  const std::string legend_markup = legend_svg(legend, legend_bottom);

  AxisSpec xa;
  xa.title = x_title;
  Plot p{kMarginLeft, kWidth - kMarginRight, legend_bottom + 6 + (stacks.size() <= 8 ? 14 : 0), kHeight - kMarginBottom,
         {}, {}, xa, ya};
  AxisSpec yspec = ya;
  yspec.zero_based = true;
  p.ya = yspec;
  p.yt = make_ticks(0, yhi, yspec);
  p.xt = {0, 1, {}};  // categorical: labels drawn per bar below

  std::ostringstream o;
  o << svg_open(id, title) << legend_markup << p.axes();
  const double band = (p.right - p.left) / stacks.size();
  const double bar_w = std::min(band * (stacks.size() <= 8 ? 0.5 : 0.8), 90.0);
  const size_t label_every = std::max<size_t>(1, (stacks.size() + 11) / 12);
  o << "<g class=\"series bars\" data-name=\"" << esc(title) << "\" data-points=\"" << drawn << "\">";
  for (size_t i = 0; i < stacks.size(); ++i) {
    const auto& s = stacks[i];
    const double cx = p.left + band * (i + 0.5);
    double acc = 0;
    for (size_t c = 0; c < cats.size() && c < s.values.size(); ++c) {
      const double v = s.values[c];
      if (!std::isfinite(v) || v <= 0) continue;
      const double y0 = p.y(acc), y1 = p.y(acc + v);
      o << "<rect class=\"bar\" data-stack=\"" << esc(s.label) << "\" data-category=\"" << esc(cats[c].name)
        << "\" data-value=\"" << num(v, 12) << "\" x=\""
        << px(cx - bar_w / 2) << "\" y=\"" << px(y1) << "\" width=\"" << px(bar_w) << "\" height=\""
        << px(std::max(0.0, y0 - y1)) << "\" fill=\"" << cats[c].color << "\"><title>" << esc(s.label) << " · "
        << esc(cats[c].name) << ": " << esc(ya.label(v)) << "</title></rect>";
      acc += v;
    }
    if (!s.placeholder.empty())
      o << "<text class=\"no-data placeholder\" x=\"" << px(cx) << "\" y=\"" << px((p.top + p.bottom) / 2)
        << "\" text-anchor=\"middle\">" << esc(s.placeholder) << "</text>";
    if (std::isfinite(s.marker)) {
      const double ym = p.y(s.marker);
      o << "<line class=\"bar-marker\" x1=\"" << px(cx - bar_w / 2 - 6) << "\" x2=\"" << px(cx + bar_w / 2 + 6) << "\" y1=\""
        << px(ym) << "\" y2=\"" << px(ym) << "\" stroke=\"#222\" stroke-width=\"1.5\" stroke-dasharray=\"4 2\"/>";
      if (!s.marker_label.empty())
        o << "<text class=\"bar-label\" x=\"" << px(cx + bar_w / 2 + 8) << "\" y=\"" << px(ym + 4) << "\">"
          << esc(s.marker_label) << "</text>";
    }
    if (!s.top_label.empty())
      o << "<text class=\"bar-label\" x=\"" << px(cx) << "\" y=\"" << px(p.y(acc) - 5) << "\" text-anchor=\"middle\">"
        << esc(s.top_label) << "</text>";
    if (i % label_every == 0)
      o << "<text class=\"bar-axis-label\" x=\"" << px(cx) << "\" y=\"" << px(p.bottom + 16) << "\" text-anchor=\"middle\">"
        << esc(s.axis_label.empty() ? s.label : s.axis_label) << "</text>";
  }
  o << "</g>";
  if (!caption.empty())
    o << "<text class=\"caption\" x=\"" << px(p.right) << "\" y=\"" << px(p.bottom + 36) << "\" text-anchor=\"end\">"
      << esc(caption) << "</text>";
  o << "</svg>";
  return o.str();
}

}  // namespace shardlm::observe::svg
