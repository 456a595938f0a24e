-- The front door's one reader of a request body (HAProxy 2.6, Lua 5.3).
--
-- HAProxy routes a request by its JSON `model`, vLLM serves the `model` its
-- own parser reads: they must be the same value, or a caller could be routed
-- (and checked against its grants) as one model and served as another. So the
-- door reads the body strictly and refuses what two parsers could read two
-- ways: duplicate top-level keys (Python keeps the last, a naive scanner the
-- first), a `model` that is not a string, and anything that is not plain JSON
-- (NaN and Infinity, which Python accepts; a byte-order mark; trailing bytes;
-- invalid UTF-8). Top-level keys and the `model` value are decoded exactly
-- (escapes included: Python sees "mod\u0065l" as "model"); nested values are
-- only checked, never built.
--
-- Bounds: the body is at most the door's body limit (HAProxy buffers it whole,
-- `option http-buffer-request`; a larger one gets a 413 before this runs), the
-- scan is one linear pass with an explicit stack (MAX_DEPTH, no recursion),
-- and HAProxy stops any Lua action that runs longer than
-- `tune.lua.session-timeout` (rendered by serving/door/haproxy.py).
--
-- Sets txn.model (the decoded name) when the body has one, or txn.body_error
-- (a sentence naming the problem, answered as a 400) when it is refused.

local MAX_DEPTH = 128

-- A quoted JSON string starting at i (s:byte(i) == '"'): the index after its
-- closing quote and whether it holds escapes, or nil and why not. Raw control
-- characters are invalid JSON (Python's strict mode refuses them too).
local function scan_string(s, i)
  local j = i + 1
  local escaped = false
  while true do
    local k = s:find('["\\\0-\31]', j)
    if not k then
      return nil, "an unterminated string"
    end
    local c = s:byte(k)
    if c == 34 then
      return k + 1, escaped
    elseif c == 92 then
      escaped = true
      local e = s:byte(k + 1)
      if e == 117 then -- \uXXXX
        if not s:find("^%x%x%x%x", k + 2) then
          return nil, "an invalid \\u escape"
        end
        j = k + 6
      elseif e == 34 or e == 92 or e == 47 or e == 98 or e == 102 or e == 110 or e == 114 or e == 116 then
        j = k + 2
      else
        return nil, "an invalid escape"
      end
    else
      return nil, "a control character inside a string"
    end
  end
end

local SIMPLE = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }

-- The exact text of an escaped string's body (already checked by scan_string),
-- as Python's json module decodes it, left to right; nil for a lone surrogate,
-- which no name the door routes can hold.
local function unescape(body)
  local parts, i = {}, 1
  while true do
    local k = body:find("\\", i, true)
    if not k then
      parts[#parts + 1] = body:sub(i)
      return table.concat(parts)
    end
    parts[#parts + 1] = body:sub(i, k - 1)
    local e = body:sub(k + 1, k + 1)
    if e == "u" then
      local code = tonumber(body:sub(k + 2, k + 5), 16)
      i = k + 6
      if code >= 0xD800 and code <= 0xDBFF then
        local low = body:sub(i, i + 1) == "\\u" and tonumber(body:sub(i + 2, i + 5), 16)
        if not low or low < 0xDC00 or low > 0xDFFF then
          return nil
        end
        code = 0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00)
        i = i + 6
      elseif code >= 0xDC00 and code <= 0xDFFF then
        return nil
      end
      parts[#parts + 1] = utf8.char(code)
    else
      parts[#parts + 1] = SIMPLE[e]
      i = k + 2
    end
  end
end

local function decoded(s, i, after, escaped)
  local body = s:sub(i + 1, after - 2)
  if escaped then
    return unescape(body)
  end
  return body
end

local function scan_number(s, i)
  local j = i
  if s:byte(j) == 45 then
    j = j + 1
  end
  local c = s:byte(j)
  if c == 48 then
    j = j + 1
  elseif c and c >= 49 and c <= 57 then
    local _, e = s:find("^%d*", j + 1)
    j = e + 1
  else
    return nil
  end
  if s:byte(j) == 46 then
    local _, e = s:find("^%d+", j + 1)
    if not e then
      return nil
    end
    j = e + 1
  end
  c = s:byte(j)
  if c == 101 or c == 69 then
    j = j + 1
    c = s:byte(j)
    if c == 43 or c == 45 then
      j = j + 1
    end
    local _, e = s:find("^%d+", j)
    if not e then
      return nil
    end
    j = e + 1
  end
  return j
end

local function ws(s, i)
  return s:find("[^ \t\r\n]", i) or (#s + 1)
end

-- Reads the body: (model or nil), or (nil, why it is refused).
local function read_body(s)
  if not utf8.len(s) then
    return nil, "the request body is not valid UTF-8"
  end
  local i = ws(s, 1)
  if s:byte(i) ~= 123 then
    return nil, "the request body is not a JSON object"
  end
  -- stack[n]: 123 in an object, 91 in an array; expect: what may come next.
  local stack, depth = { 123 }, 1
  local seen, model, model_kind = {}, nil, nil
  local expect = "key_or_end" -- key_or_end | key | colon | value | value_or_end | comma_or_end
  local key = nil
  i = i + 1
  while true do
    i = ws(s, i)
    local c = s:byte(i)
    if not c then
      return nil, "the request body ends inside a JSON value"
    end
    local top = stack[depth]
    if expect == "key_or_end" or expect == "key" then
      if c == 125 and expect == "key_or_end" then
        expect, i = "close", i
      elseif c == 34 then
        local after, escaped = scan_string(s, i)
        if not after then
          return nil, "the request body has " .. escaped
        end
        if depth == 1 then
          key = decoded(s, i, after, escaped)
          if key == nil then
            return nil, "the request body has a key with an invalid \\u escape"
          end
          if seen[key] then
            return nil, "the request body has the key `" .. key:sub(1, 64) .. "` twice"
          end
          seen[key] = true
        end
        i, expect = after, "colon"
      else
        return nil, "the request body is not valid JSON (expected a key at byte " .. i .. ")"
      end
    elseif expect == "colon" then
      if c ~= 58 then
        return nil, "the request body is not valid JSON (expected ':' at byte " .. i .. ")"
      end
      i, expect = i + 1, "value"
    elseif expect == "value" or expect == "value_or_end" then
      local is_model = depth == 1 and key == "model"
      if c == 93 and expect == "value_or_end" then
        expect = "close"
      elseif c == 123 or c == 91 then
        if depth >= MAX_DEPTH then
          return nil, "the request body nests deeper than " .. MAX_DEPTH .. " levels"
        end
        depth = depth + 1
        stack[depth] = c
        if is_model then
          model_kind = c == 123 and "an object" or "an array"
        end
        i = i + 1
        expect = c == 123 and "key_or_end" or "value_or_end"
      else
        local after
        if c == 34 then
          local escaped
          after, escaped = scan_string(s, i)
          if not after then
            return nil, "the request body has " .. escaped
          end
          if is_model then
            model = decoded(s, i, after, escaped)
            if model == nil then
              return nil, "`model` has an invalid \\u escape"
            end
          end
        elseif c == 116 and s:sub(i, i + 3) == "true" then
          after = i + 4
        elseif c == 102 and s:sub(i, i + 4) == "false" then
          after = i + 5
        elseif c == 110 and s:sub(i, i + 3) == "null" then
          after = i + 4
        else
          after = scan_number(s, i)
          if not after then
            return nil, "the request body is not valid JSON (a value at byte " .. i .. ")"
          end
        end
        if is_model and c ~= 34 then
          model_kind = (c == 110 and "null") or ((c == 116 or c == 102) and "a boolean") or "a number"
        end
        i, expect = after, "comma_or_end"
      end
    elseif expect == "comma_or_end" then
      if c == 44 then
        i = i + 1
        expect = top == 123 and "key" or "value"
      elseif (c == 125 and top == 123) or (c == 93 and top == 91) then
        expect = "close"
      else
        return nil, "the request body is not valid JSON (at byte " .. i .. ")"
      end
    end
    if expect == "close" then
      i = i + 1
      depth = depth - 1
      if depth == 0 then
        if ws(s, i) <= #s then
          return nil, "the request body has bytes after its JSON object"
        end
        if model_kind then
          return nil, "`model` must be a string, not " .. model_kind
        end
        return model
      end
      expect = "comma_or_end"
    end
  end
end

core.register_action("inspect_body", { "http-req" }, function(txn)
  local body = txn.sf:req_body() or ""
  if body == "" then
    return -- no body: vLLM serves its first name, the base model (haproxy.py)
  end
  local model, problem = read_body(body)
  if problem then
    txn:set_var("txn.body_error", problem)
  elseif model then
    txn:set_var("txn.model", model)
  end
end, 0)

-- The hold (docs/door.md#holding): while the control plane swaps a model on
-- the only replica that serves it, its new requests wait here instead of
-- meeting the gap (Knative's activator, inside the door). held.map (its path in
-- DOOR_HELD_MAP, set by haproxy.cfg) maps a served name to
-- "<deadline, epoch ms>-<owner>"; only the runtime API on the door's UNIX
-- socket changes it. Map.new at load time shares HAProxy's one copy of the
-- file's entries, so `add map`/`del map` are seen by the next lookup.
--
-- A request waits while its model has an entry whose deadline is ahead, and at
-- most `most_ms` (SERVING_DOOR_HOLD_SECONDS) from when it arrived: a worker
-- that died mid-hold, or a clock far off, never holds it longer. Then it goes
-- on to `use_backend`, which is chosen after this action: to the new version.
-- core.msleep yields (other requests run meanwhile) and a wait is not Lua
-- time, so tune.lua.session-timeout does not end it.
local HELD_MAP = os.getenv("DOOR_HELD_MAP")
local held = HELD_MAP and Map.new(HELD_MAP, Map._str)
-- How soon a held request sees its model released.
local HOLD_POLL_MS = 20

local function now_ms()
  local now = core.now()
  return now.sec * 1000 + now.usec // 1000
end

core.register_action("hold_model", { "http-req" }, function(txn, most_ms)
  local model = txn:get_var("txn.model")
  if not held or not model then
    return
  end
  local started = now_ms()
  local limit = started + (tonumber(most_ms) or 0)
  while true do
    local entry = held:lookup(model)
    local deadline = entry and tonumber(entry:match("^(%d+)"))
    local now = now_ms()
    local until_ms = deadline and math.min(deadline, limit)
    if not until_ms or now >= until_ms then
      break
    end
    core.msleep(math.max(1, math.min(HOLD_POLL_MS, until_ms - now)))
  end
  txn:set_var("txn.held_ms", now_ms() - started)
end, 1)
