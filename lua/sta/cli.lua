--[[
sta.cli -- the small pieces the example scripts share: option parsing,
triples and window lists in the spellings every binding takes (sta.options:
"AxBxC" or "A,B,C"; "3,3,3:1,5,7" or "1x1x1,3x3x3"), a progress bar on
stderr, tables of numbers.
]]
local options = require "sta.options"

local cli = {}

--- Parse argv against spec = {name = default, ...}.  Accepts --name value,
-- --name=value, --flag (booleans) and --no-flag.  Unknown options and
-- bad values raise a message naming the option.  Numbers are converted
-- when the default is a number.  Returns the options table.
function cli.parse(argv, spec, usage)
  local opts = {}
  for k, v in pairs(spec) do opts[k] = v end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    if a == "-h" or a == "--help" then
      io.stdout:write(usage or "", "\n")
      os.exit(0)
    end
    local name, value = a:match("^%-%-([%w%-_]+)=(.*)$")
    if not name then name = a:match("^%-%-([%w%-_]+)$") end
    if not name then error(("%s: expected --option, got '%s'"):format(arg and arg[0] or "", a), 0) end
    name = name:gsub("%-", "_")
    local negated = false
    if spec[name] == nil and name:match("^no_") and type(spec[name:sub(4)]) == "boolean" then
      name, negated = name:sub(4), true
    end
    local def = spec[name]
    if def == nil then error(("--%s: unknown option"):format(name:gsub("_", "-")), 0) end
    if type(def) == "boolean" then
      if value then opts[name] = value == "1" or value == "true" or value == "yes"
      else opts[name] = not negated end
    else
      if not value then
        i = i + 1
        value = argv[i]
        if value == nil then error(("--%s: expected a value"):format(name:gsub("_", "-")), 0) end
      end
      if type(def) == "number" then
        local n = tonumber(value)
        if not n then error(("--%s: expected a number, got '%s'"):format(name:gsub("_", "-"), value), 0) end
        opts[name] = n
      else
        opts[name] = value
      end
    end
    i = i + 1
  end
  return opts
end

--- "12x16x16" (or "12,16,16") -> {12, 16, 16}: sta.options' triple
function cli.triple(s, what)
  return options.check_value(what or "value", tostring(s), { kind = "triple", min = 1 })
end

--- "3x3x3", "3,3,3", "3,3,3:1,5,7" or "1x1x1,3x3x3" -> a list of windows
-- (one or one per head): sta.options' windows
function cli.windows(s, what)
  local w = options.check_value(what or "value", tostring(s), { kind = "windows" })
  return type(w[1]) == "table" and w or { w }
end

function cli.fmt_triple(t) return table.concat(t, "x") end

--- Raise a bad-option error (cli.main: usage, status 2).
function cli.bad(fmt, ...)
  error({ bad_option = ("%s"):format(fmt:format(...)) }, 0)
end

--- cli.bad(...) unless cond.
function cli.check(cond, ...)
  if not cond then cli.bad(...) end
  return cond
end

--- opts[name] must be an integer >= lo; raises naming --name.
function cli.int(opts, name, lo)
  local v = opts[name]
  cli.check(math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v)),
    "--%s: expected an integer, got %s", name:gsub("_", "-"), tostring(v))
  cli.check(v >= lo, "--%s: expected an integer >= %d, got %d", name:gsub("_", "-"), lo, v)
  return math.tointeger(v)
end

--- Run an example's main(): an error ends the script with "name: message"
-- on stderr and status 1, a bad option (cli.bad) with the usage and
-- status 2; never a traceback.
function cli.main(name, main, usage)
  local ok, err = xpcall(main, function(e) return e end)
  if ok then return end
  if type(err) == "table" and err.bad_option then
    io.stderr:write(name, ": ", err.bad_option, "\n", usage and (usage .. "\n") or "")
    os.exit(2)
  end
  io.stderr:write(name, ": ", tostring(err), "\n")
  os.exit(1)
end

local stderr_is_tty
local function tty()
  if stderr_is_tty == nil then stderr_is_tty = os.execute("[ -t 2 ]") == true end
  return stderr_is_tty
end

--- A progress bar on stderr (only when stderr is a terminal and
-- STA_NO_PROGRESS is unset).
function cli.progress(total, label)
  local bar = { total = total, done = 0, label = label or "", width = 30,
    quiet = os.getenv("STA_NO_PROGRESS") ~= nil or not tty() }
  function bar:update(done, note)
    self.done = done
    if self.quiet then return end
    local filled = math.floor(self.width * done / math.max(self.total, 1) + 0.5)
    io.stderr:write(("\r%s [%s%s] %3d%% %s\27[K"):format(self.label, ("#"):rep(filled),
      ("."):rep(self.width - filled), math.floor(100 * done / math.max(self.total, 1) + 0.5), note or ""))
    io.stderr:flush()
  end
  function bar:finish()
    if not self.quiet then io.stderr:write("\r\27[K") io.stderr:flush() end
  end
  return bar
end

--- Print rows as an aligned table: header = {"a", "b"}, rows = {{..}, ..}.
function cli.table(header, rows, out)
  out = out or io.stdout
  local w = {}
  local all = { header }
  for _, r in ipairs(rows) do all[#all + 1] = r end
  for _, r in ipairs(all) do
    for i, c in ipairs(r) do w[i] = math.max(w[i] or 0, #tostring(c)) end
  end
  for n, r in ipairs(all) do
    local cells = {}
    for i, c in ipairs(r) do cells[i] = ("%" .. w[i] .. "s"):format(tostring(c)) end
    out:write(table.concat(cells, "  "), "\n")
    if n == 1 then
      local rule = {}
      for i = 1, #w do rule[i] = ("-"):rep(w[i]) end
      out:write(table.concat(rule, "  "), "\n")
    end
  end
end


--- An example's options, each written once: list = {{name, default,
-- metavar, what [, default = "text"]}, ...} in the order --help shows them
-- (name with "_"; metavar false for a flag; default text for a default
-- that needs words, e.g. a sentinel).  Returns spec (cli.parse's), the
-- usage lines and the --help text: usage, about, one line per option with
-- its default, then epilog.
function cli.options(prog, about, list, epilog)
  local spec, parts, lines = {}, {}, {}
  for _, o in ipairs(list) do
    local name, default, metavar, what = o[1], o[2], o[3], o[4]
    spec[name] = default
    local left = "--" .. name:gsub("_", "-") .. (metavar and (" " .. metavar) or "")
    parts[#parts + 1] = "[" .. left .. "]"
    local def = o.default
    if def == nil then
      if type(default) == "boolean" then def = default and "on" or "off"
      elseif default ~= "" then def = tostring(default) end
    end
    local text = what .. (def and (" (default " .. def .. ")") or "")
    if #left > 22 then lines[#lines + 1] = "  " .. left .. "\n" .. (" "):rep(27) .. text
    else lines[#lines + 1] = ("  %-24s %s"):format(left, text) end
  end
  local usage, line = {}, "usage: " .. prog
  for _, p in ipairs(parts) do
    if #line + #p + 1 > 92 then usage[#usage + 1] = line; line = (" "):rep(8 + #prog) .. p
    else line = line .. " " .. p end
  end
  usage[#usage + 1] = line
  usage = table.concat(usage, "\n")
  local help = usage .. "\n\n" .. about:gsub("%s+$", "") .. "\n\noptions:\n" .. table.concat(lines, "\n")
    .. ("\n  %-24s %s"):format("-h, --help", "this text")
  if epilog then help = help .. "\n\n" .. epilog:gsub("%s+$", "") end
  return spec, usage, help
end

--- A folder for an example's files: path made (mkdir -p), or when path is
-- "" a new one under $TMPDIR (/tmp), named after the example.  Returns it.
function cli.out_dir(path, name)
  local function q(p) return "'" .. p:gsub("'", "'\\''") .. "'" end
  if path == "" then
    local f = io.popen(("mktemp -d %s"):format(q((os.getenv("TMPDIR") or "/tmp") .. "/sta-" .. name .. ".XXXXXX")))
    path = f and f:read("l") or ""
    if f then f:close() end
    if path == "" then error("cannot make a temporary folder (mktemp -d)", 0) end
  elseif not os.execute("mkdir -p " .. q(path)) then
    error(("--out %s: cannot make the folder"):format(path), 0)
  end
  return path
end

return cli
