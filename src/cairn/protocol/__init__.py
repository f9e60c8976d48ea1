"""The commit protocol and its parts: how a checkpoint comes to exist, is read, and goes.

Uploads (``_upload``), the commit (``_commit``), leases and claims (``_lease``), the
``_latest`` pointer and the writer record (``_pointer``), the catalog of committed
checkpoints (``_catalog``), restore chains and downloads (``_chains``, ``_download``),
directory partitions (``_directories``), and the public :mod:`~cairn.protocol.retention`
(policies and GC) and :mod:`~cairn.protocol.discover` (finding checkpoints). Every part
takes the checkpointer's :class:`~cairn.protocol._context.Context`; the façades
(:mod:`cairn.checkpointer`, :mod:`cairn.sync`) put them together.
"""
