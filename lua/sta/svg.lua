--[[
sta.svg -- pictures of masks as standalone SVG text, no dependencies.

  svg.strategy(s, {grid = {NT, NH, NW} or geometry, path =, title =})
      A mask strategy as heatmaps: one panel per range of steps whose
      tables are identical, layers down, heads across, each cell coloured
      by the window's volume as a fraction of the full volume, with a
      legend of the windows used.
  svg.tiles(geometry, query_tile {it, ih, iw}, window {Kt, Kh, Kw}, {path =})
      For one query tile (0-based tile coordinates), the tiles it attends
      to: one H x W grid of tiles per T tile slice, attended tiles
      coloured, the query tile marked.
Both return the SVG text, and write it to opts.path when given (then they
return text, or nil, message on a write failure).  The file is replaced
atomically, as every file sta writes: through sta.core's write_file (a
temporary file beside it, fsync, rename) when the C module is there, else
a temporary file renamed over it; a failed write leaves the old file.
]]
local svg = {}

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

-- viridis stops, 0 (sparse) .. 1 (full)
local STOPS = {
  { 0.00, 68, 1, 84 }, { 0.25, 59, 82, 139 }, { 0.50, 33, 145, 140 },
  { 0.75, 94, 201, 98 }, { 1.00, 253, 231, 37 },
}

--- Colour for x in [0, 1] as "#rrggbb".
function svg.color(x)
  x = math.max(0, math.min(1, x))
  for i = 2, #STOPS do
    local a, b = STOPS[i - 1], STOPS[i]
    if x <= b[1] then
      local f = (x - a[1]) / (b[1] - a[1])
      return ("#%02x%02x%02x"):format(math.floor(a[2] + f * (b[2] - a[2]) + 0.5),
        math.floor(a[3] + f * (b[3] - a[3]) + 0.5), math.floor(a[4] + f * (b[4] - a[4]) + 0.5))
    end
  end
  return "#fde725"
end

local Doc = {}
Doc.__index = Doc

local function doc(w, h)
  return setmetatable({ w = w, h = h, parts = {} }, Doc)
end

function Doc:add(fmt, ...) self.parts[#self.parts + 1] = fmt:format(...) end

function Doc:rect(x, y, w, h, fill, extra)
  self:add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"%s/>', x, y, w, h, fill, extra or "")
end

function Doc:text(x, y, s, extra)
  self:add('<text x="%.1f" y="%.1f"%s>%s</text>', x, y, extra or "", esc(s))
end

function Doc:render()
  return table.concat({
    ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
      .. 'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">'):format(
      math.ceil(self.w), math.ceil(self.h), math.ceil(self.w), math.ceil(self.h)),
    '<rect width="100%" height="100%" fill="white"/>',
    table.concat(self.parts, "\n"),
    "</svg>\n" }, "\n")
end

local has_core, core = pcall(require, "sta.core")

local function write_atomic(path, text)
  if has_core and core.write_file then
    local ok, msg = core.write_file(path, text)
    return ok, msg
  end
  -- no C module (LuaJIT): a temporary name beside the target, then rename
  local dir = path:match("^(.*)/[^/]*$") or "."
  local tmp = ("%s/.%s.%d.tmp"):format(dir, path:match("[^/]*$"), math.random(1, 1e9))
  local f, msg = io.open(tmp, "wb")
  if not f then return nil, ("%s: cannot open for writing: %s"):format(path, msg) end
  local ok, werr = f:write(text)
  local closed = f:close()
  if ok and closed then ok, werr = os.rename(tmp, path) end
  if not ok or not closed then
    os.remove(tmp)
    return nil, ("%s: write failed: %s"):format(path, tostring(werr))
  end
  return true
end

local function finish(text, path)
  if path then
    local ok, msg = write_atomic(path, text)
    if not ok then return nil, msg end
  end
  return text
end

local function grid_of(g)
  if g == nil then return nil end
  if type(g) == "userdata" then return g:grid() end
  return g
end

local function key(w) return ("%dx%dx%d"):format(w[1], w[2], w[3]) end

--- The heatmap of a mask strategy.
function svg.strategy(s, opts)
  opts = opts or {}
  local steps, layers, heads = s:extent()
  if steps == 0 then error("strategy: empty", 0) end
  local grid = grid_of(opts.grid)
  -- tables per step, and windows in use
  local tables, windows, order = {}, {}, {}
  local maxw = { 1, 1, 1 }
  for st = 0, steps - 1 do
    local rows, sig = {}, {}
    for l = 0, layers - 1 do
      rows[l] = {}
      for h = 0, heads - 1 do
        local ok, w = pcall(s.get, s, st, l, h)
        w = ok and w or false
        rows[l][h] = w
        sig[#sig + 1] = w and key(w) or "-"
        if w then
          if not windows[key(w)] then windows[key(w)] = w; order[#order + 1] = key(w) end
          for a = 1, 3 do maxw[a] = math.max(maxw[a], w[a]) end
        end
      end
    end
    tables[st] = { rows = rows, sig = table.concat(sig, ",") }
  end
  grid = grid or maxw
  local full = grid[1] * grid[2] * grid[3]
  local function frac(w)
    local v = 1
    for a = 1, 3 do v = v * math.min(w[a], grid[a]) end
    return v / full
  end
  table.sort(order, function(a, b)
    local fa, fb = frac(windows[a]), frac(windows[b])
    if fa ~= fb then return fa < fb end
    return a < b
  end)
  -- colours: windows ranked by volume, spread evenly over the scale so
  -- that close volumes stay distinguishable; the full window is always
  -- the top colour
  local shade = {}
  for i, k in ipairs(order) do
    shade[k] = frac(windows[k]) >= 1 and 1 or (#order > 1 and (i - 1) / (#order - 1) or 0)
  end
  local function colour(w) return svg.color(shade[key(w)]) end
  -- panels: ranges of consecutive steps with identical tables
  local panels = {}
  for st = 0, steps - 1 do
    local last = panels[#panels]
    if last and tables[last.first].sig == tables[st].sig then last.last = st
    else panels[#panels + 1] = { first = st, last = st } end
  end
  local max_panels = opts.max_panels or 12
  if #panels > max_panels then -- too many: show the first step of each of max_panels chunks
    local chunk, merged = math.ceil(steps / max_panels), {}
    for st = 0, steps - 1, chunk do
      merged[#merged + 1] = { first = st, last = math.min(st + chunk - 1, steps - 1), sampled = true }
    end
    panels = merged
  end
  -- layout
  local cell = opts.cell or math.max(6, math.min(24, math.floor(360 / math.max(heads, layers))))
  local pw, ph = heads * cell, layers * cell
  local margin, gap, top = 56, 28, 56
  local cols = math.min(#panels, opts.columns or 4)
  local rows_n = math.ceil(#panels / cols)
  local legend_w = 230
  local W = margin + cols * (pw + gap) + legend_w
  local Hh = top + rows_n * (ph + gap + 24) + 20
  Hh = math.max(Hh, top + 40 + 18 * #order + 20)
  local d = doc(W, Hh)
  local sp = opts.sparsity or (pcall(s.sparsity, s, grid) and s:sparsity(grid))
  d:text(margin, 24, opts.title or ("Mask strategy: %d steps x %d layers x %d heads"):format(steps, layers, heads),
    ' font-size="16" font-weight="bold"')
  d:text(margin, 42, ("grid %s tiles; sparsity %s; colour: window volume (ranked), yellow = full"):format(
    key(grid), sp and ("%.3f"):format(sp) or "?"), ' fill="#444"')
  for i, p in ipairs(panels) do
    local c, r = (i - 1) % cols, (i - 1) // cols
    local x0, y0 = margin + c * (pw + gap), top + 24 + r * (ph + gap + 24)
    local label = p.first == p.last and ("step %d"):format(p.first) or ("steps %d-%d"):format(p.first, p.last)
    if p.sampled then label = label .. " (shows " .. p.first .. ")" end
    d:text(x0, y0 - 6, label, ' font-weight="bold"')
    local t = tables[p.first].rows
    for l = 0, layers - 1 do
      for h = 0, heads - 1 do
        local w = t[l][h]
        local fill = w and colour(w) or "#dddddd"
        local title = w and ("<title>step %d layer %d head %d: %s</title>"):format(p.first, l, h, key(w)) or ""
        d:add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="white" stroke-width="0.5">%s</rect>',
          x0 + h * cell, y0 + l * cell, cell, cell, fill, title)
      end
    end
    d:rect(x0, y0, pw, ph, "none", ' stroke="#333" stroke-width="1"')
    if c == 0 then
      d:text(x0 - 20, y0 + ph / 2, "layer", (' text-anchor="middle" fill="#444" transform="rotate(-90 %.1f %.1f)"')
        :format(x0 - 20, y0 + ph / 2))
      d:text(x0 - 4, y0 + cell * 0.5 + 4, "0", ' text-anchor="end" font-size="9" fill="#444"')
      d:text(x0 - 4, y0 + ph - cell * 0.5 + 4, tostring(layers - 1), ' text-anchor="end" font-size="9" fill="#444"')
    end
    d:text(x0, y0 + ph + 12, "head 0", ' font-size="9" fill="#444"')
    d:text(x0 + pw, y0 + ph + 12, tostring(heads - 1), ' font-size="9" fill="#444" text-anchor="end"')
  end
  -- legend: the windows in use, smallest volume first
  local lx, ly = margin + cols * (pw + gap) + 4, top + 24
  local wy = ly
  d:text(lx, wy - 6, "window (Kt x Kh x Kw)", ' font-weight="bold"')
  for i, k in ipairs(order) do
    local y = wy + (i - 1) * 18
    d:rect(lx, y, 14, 14, colour(windows[k]), ' stroke="#333" stroke-width="0.5"')
    d:text(lx + 20, y + 11, ("%s  %.0f%%"):format(k, 100 * frac(windows[k])))
  end
  return finish(d:render(), opts.path)
end

--- The tiles one query tile attends to.
function svg.tiles(g, query, window, opts)
  opts = opts or {}
  local grid = g:grid()
  local keys = g:key_tiles(query, window) -- raises on a bad tile or window
  local on = {}
  for _, t in ipairs(keys) do on[key(t)] = true end
  local canvas, tile = g.canvas, g.tile
  local cell = opts.cell or math.max(10, math.min(36, math.floor(240 / math.max(grid[2], grid[3]))))
  local pw, ph = grid[3] * cell, grid[2] * cell
  local margin, gap, top = 40, 22, 70
  local cols = math.min(grid[1], opts.columns or 6)
  local rows_n = math.ceil(grid[1] / cols)
  local W = math.max(margin + cols * (pw + gap) + 20, 640)
  local Hh = top + rows_n * (ph + gap + 20) + 40
  local d = doc(W, Hh)
  d:text(margin, 24, opts.title or ("Query tile (%d, %d, %d), window %s"):format(query[1], query[2], query[3],
    key(window)), ' font-size="16" font-weight="bold"')
  d:text(margin, 42, ("canvas %s tokens, tile %s, grid %s; %d of %d tiles attended (%.0f%%)"):format(
    key(canvas), key(tile), key(grid), #keys, grid[1] * grid[2] * grid[3],
    100 * #keys / (grid[1] * grid[2] * grid[3])), ' fill="#444"')
  local attended, query_fill = opts.color or "#3b528b", opts.query_color or "#fde725"
  for it = 0, grid[1] - 1 do
    local c, r = it % cols, it // cols
    local x0, y0 = margin + c * (pw + gap), top + r * (ph + gap + 20)
    d:text(x0, y0 - 6, ("t tile %d"):format(it), ' font-weight="bold" font-size="11"')
    for ih = 0, grid[2] - 1 do
      for iw = 0, grid[3] - 1 do
        local k = key{ it, ih, iw }
        local is_q = it == query[1] and ih == query[2] and iw == query[3]
        local fill = is_q and query_fill or (on[k] and attended or "#eeeeee")
        -- partial border tiles drawn smaller, in proportion to their tokens
        local fw = math.min(tile[3], canvas[3] - iw * tile[3]) / tile[3]
        local fh = math.min(tile[2], canvas[2] - ih * tile[2]) / tile[2]
        d:rect(x0 + iw * cell, y0 + ih * cell, cell * fw, cell * fh, fill, ' stroke="white" stroke-width="1"')
        if is_q then
          d:rect(x0 + iw * cell + 1, y0 + ih * cell + 1, cell * fw - 2, cell * fh - 2, "none",
            ' stroke="#d62728" stroke-width="2.5"')
          d:text(x0 + (iw + 0.5 * fw) * cell, y0 + (ih + 0.5 * fh) * cell + 4, "Q",
            ' text-anchor="middle" font-weight="bold" font-size="11" fill="#d62728"')
        end
      end
    end
    d:rect(x0, y0, cell * canvas[3] / tile[3], cell * canvas[2] / tile[2], "none",
      ' stroke="#333" stroke-width="1"')
  end
  local ly = Hh - 24
  d:rect(margin, ly, 14, 14, attended)
  d:text(margin + 20, ly + 11, "attended tile")
  d:rect(margin + 130, ly, 14, 14, query_fill, ' stroke="#d62728" stroke-width="2"')
  d:text(margin + 150, ly + 11, "query tile")
  d:rect(margin + 240, ly, 14, 14, "#eeeeee")
  d:text(margin + 260, ly + 11, "not attended (h down, w across)")
  return finish(d:render(), opts.path)
end

return svg
