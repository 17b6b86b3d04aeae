/** The gputap icon: a GPU board with a tap. */
import { LabIcon } from '@jupyterlab/ui-components';

const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M2 6h17a1 1 0 0 1 1 1v9a1 1 0 0 1-1 1h-6v2h-2v-2H4v3H2zm3 3v5h5V9zm7 0v2h2V9zm3 0v2h2V9zm-3 3v2h2v-2zm3 0v2h2v-2z"/>
    <path d="M21 9h1.5v5H21z"/>
  </g>
</svg>`;

export const gputapIcon = new LabIcon({ name: 'gputap-lab:icon', svgstr });
