// The corpus report's page script (reports/corpus_html.py). Sorting and filtering read `data-v`
// (a cell's sort value) and each row tbody's data-* attributes; the state lives in the URL fragment.
(function(){
  const rowsTable = document.getElementById('rows');
  const groups = Array.from(rowsTable.tBodies);
  const order = groups.slice();
  function params(){ return new URLSearchParams(location.hash.slice(1)); }
  function setParam(k, v){ const p = params(); if (v === '' || v === null || v === false) p.delete(k); else p.set(k, v);
    location.hash = p.toString(); }
  function key(cell, type){ const v = cell.dataset.v !== undefined ? cell.dataset.v : cell.textContent;
    if (type !== 'num') return v.toLowerCase(); const n = parseFloat(v); return isNaN(n) ? null : n; }
  function sortUnits(units, col, type, desc){
    return units.slice().sort(function(a, b){
      const ka = key(a.cells[col], type), kb = key(b.cells[col], type);
      if (ka === kb) return 0; if (ka === null) return 1; if (kb === null) return -1;
      return (ka < kb ? -1 : 1) * (desc ? -1 : 1); });
  }
  function mark(table, col, desc){ Array.from(table.tHead.rows[0].cells).forEach(function(th, i){
    th.classList.remove('asc', 'desc'); if (i === col) th.classList.add(desc ? 'desc' : 'asc'); }); }
  function apply(){
    const p = params(); const q = (p.get('q') || '').toLowerCase(); const op = p.get('op'); const v = p.get('verdict');
    const ir = p.get('ir') === '1', flagged = p.get('flagged') === '1';
    document.getElementById('q').value = p.get('q') || ''; document.getElementById('verdict').value = v || '';
    document.getElementById('ir').checked = ir; document.getElementById('flagged').checked = flagged;
    let shown = 0;
    groups.forEach(function(g){
      const ok = (!q || g.dataset.text.indexOf(q) >= 0) && (!op || g.dataset.op === op) &&
        (!v || g.dataset.verdict === v) && (!ir || g.dataset.ir === 'changed') && (!flagged || g.dataset.flagged === '1');
      g.hidden = !ok; if (ok) shown++;
      g.rows[1].hidden = g.id !== 'row-' + p.get('open'); });
    const ths = Array.from(rowsTable.tHead.rows[0].cells); const sort = p.get('sort');
    const col = ths.findIndex(function(th){ return th.dataset.key === sort; });
    const desc = p.get('desc') !== '0';
    const units = col >= 0 ? sortUnits(order.map(function(g){ return {g: g, cells: g.rows[0].cells}; }), col,
      ths[col].dataset.type, desc).map(function(u){ return u.g; }) : order;
    units.forEach(function(g){ rowsTable.appendChild(g); });
    mark(rowsTable, col, desc);
    document.getElementById('shown').textContent = shown + ' of ' + groups.length + ' rows shown' + (op ? ' (op ' + op + ')' : '');
    const open = p.get('open') && document.getElementById('row-' + p.get('open'));
    if (open && !open.hidden) open.scrollIntoView();
  }
  Array.from(rowsTable.tHead.rows[0].cells).forEach(function(th){ th.addEventListener('click', function(){
    const p = params(); const same = p.get('sort') === th.dataset.key;
    p.set('sort', th.dataset.key); p.set('desc', same && p.get('desc') !== '0' ? '0' : '1'); location.hash = p.toString(); }); });
  groups.forEach(function(g){ g.rows[0].addEventListener('click', function(){
    setParam('open', g.rows[1].hidden ? g.id.slice(4) : ''); }); });
  document.getElementById('q').addEventListener('input', function(e){ setParam('q', e.target.value); });
  document.getElementById('verdict').addEventListener('change', function(e){ setParam('verdict', e.target.value); });
  document.getElementById('ir').addEventListener('change', function(e){ setParam('ir', e.target.checked ? '1' : ''); });
  document.getElementById('flagged').addEventListener('change', function(e){ setParam('flagged', e.target.checked ? '1' : ''); });
  const opsTable = document.getElementById('ops');
  const opRows = Array.from(opsTable.tBodies[0].rows);
  Array.from(opsTable.tHead.rows[0].cells).forEach(function(th, col){ th.addEventListener('click', function(){
    const desc = !th.classList.contains('desc');
    sortUnits(opRows, col, th.dataset.type, desc).forEach(function(r){ opsTable.tBodies[0].appendChild(r); });
    mark(opsTable, col, desc); }); });
  document.getElementById('opq').addEventListener('input', function(e){ const q = e.target.value.toLowerCase();
    opRows.forEach(function(r){ r.hidden = q && r.cells[0].textContent.toLowerCase().indexOf(q) < 0; }); });
  window.addEventListener('hashchange', apply);
  apply();
  document.body.dataset.ready = '1';
})();
